"""
LoRA (Hu et al. 2021, arXiv 2106.09685): train a low-rank update B @ A next to each frozen
projection instead of the projection itself.

    python train_rm.py --init model.gguf --lora_rank 8 --lora_alpha 16

    rm = RewardModel(pretrained=path)
    adapters = add_lora(rm, rank=8, alpha=16)        # backbone frozen, adapters in, head untouched
    print(memory_report(rm))                           # what trains and the AdamW state it needs
    opt = torch.optim.AdamW(p for p in rm.parameters() if p.requires_grad)  # after add_lora
    ...train...
    merge_lora(rm)                                     # W += alpha/r * B @ A; plain nn.Linear back
    torch.save(rm.state_dict(), path)                  # the original keys: nothing else changes

add_lora takes a Transformer or a model holding one as `.backbone` (RewardModel, critic.Critic).
It freezes every backbone weight and leaves the rest (the reward head) as it was, trainable: the
head is new and has to learn. The caller freezes it if it wants to. Until merge_lora, the
state dict holds `wq.base.weight`, `wq.lora_A`, `wq.lora_B`: a training checkpoint saved
unmerged (to resume with its optimizer state) is loaded after add_lora with the same rank.

Why. Full fine-tuning in fp32 with AdamW holds 16 bytes per parameter: the weight, its gradient
and Adam's two moments (4 bytes each). With LoRA a frozen weight costs its 4 bytes and nothing
else; only the adapters carry a gradient and moments. On SmolLM2-135M with rank 8 on all 7
projections of its 30 layers, 2.4M of 135M parameters train: Adam's state falls from about 1 GiB
to 19 MiB and the gradients from 513 MiB to 9 MiB (tests/test_lora.py prints the figures).

Init. A is Kaiming-uniform (nn.Linear's own init), B is zero, so B @ A = 0: the adapted model
equals the base exactly at step 0, and the first gradient reaches only B (A's gradient has the
factor B^T). The update is scaled by alpha / r, so changing r changes the step size little and
alpha need not be retuned (the paper sets alpha to the first r it tries and leaves it).

Simplified: no dropout on the adapter input (peft's lora_dropout defaults to 0 too; the frozen
base already limits how far the model can move), no adapter bias, and only the nn.Linear
projections of the transformer layers (not the embedding, LM head or norms).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")  # Meta's names: attention and SwiGLU


class LoRALinear(nn.Module):
    """base(x) + scale * x A^T B^T, base frozen; A (r, in), B (out, r), scale = alpha / r."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        if rank < 1 or rank > min(base.in_features, base.out_features):
            raise ValueError(f"LoRA rank {rank} for a {base.in_features}->{base.out_features}")
        self.base = base.requires_grad_(False)
        self.rank, self.scale = rank, alpha / rank
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear initialises weight

    def forward(self, x):
        y = self.base(x)
        # two thin matmuls (in -> r -> out), never the (out, in) product B @ A. Under autocast
        # F.linear casts to the autocast dtype; outside it x is cast to the adapters' dtype and
        # the update back to y's, so a bf16 base with fp32 adapters (or the reverse) still adds.
        update = F.linear(F.linear(x.to(self.lora_A.dtype), self.lora_A), self.lora_B)
        return y + (update * self.scale).to(y.dtype)

    @torch.no_grad()
    def merged_weight(self):
        """W + scale * B @ A in W's dtype (the product is formed in fp32: a bf16 sum of r terms
        would lose the small update against W's larger entries)."""
        W = self.base.weight
        return (W.float() + self.scale * (self.lora_B.float() @ self.lora_A.float())).to(W.dtype)

    def extra_repr(self):
        return f"rank={self.rank}, scale={self.scale:g}"


def _backbone(model):
    return getattr(model, "backbone", model)  # a reward model or critic holds its Transformer


def add_lora(model, rank=8, alpha=16, layers=None, targets=TARGETS):
    """Wrap `targets` of each transformer layer in `layers` (indices; None: all) of `model` (a
    Transformer, or a model with one as `.backbone`) in LoRALinear, in place. Every backbone
    weight is frozen, also in layers left without adapters; parameters outside the backbone
    (a reward head) keep their requires_grad. Returns the adapter parameters, A and B of each.
    Call it before building the optimizer and before wrapping the model in DDP: both take the
    parameters that exist (and train) when they are made."""
    backbone = _backbone(model)
    backbone.requires_grad_(False)
    indices = range(len(backbone.layers)) if layers is None else layers
    adapters = []
    for i in indices:
        for name, module in list(backbone.layers[i].named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name not in targets:
                    continue
                if type(child) is not nn.Linear:  # a second add_lora would wrap a LoRALinear
                    raise TypeError(f"layers.{i}.{name}.{child_name} is {type(child).__name__}")
                lora = LoRALinear(child, rank, alpha)
                setattr(module, child_name, lora)
                adapters += [lora.lora_A, lora.lora_B]
    if not adapters:
        raise ValueError(f"add_lora: no nn.Linear named {targets} in layers {list(indices)}")
    return adapters


def merge_lora(model):
    """Fold every adapter into its base weight and put the plain nn.Linear back, in place, so
    the state dict has the original keys and shapes (checkpoints, eval_rm.py, export_hf.py read
    it as any other). The merged weights stay frozen, as the rest of the backbone. Returns
    model. Training on afterwards needs a new add_lora and a new optimizer."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                child.base.weight.copy_(child.merged_weight())
                setattr(module, child_name, child.base)
    return model


def merged_state_dict(model):
    """model.state_dict() as merge_lora would leave it, without touching model: each adapted
    projection's weight is W + alpha/r * B @ A under its original key, and no adapter key is
    left. What a checkpoint stores, so that nothing that reads one needs to know of LoRA."""
    adapted = {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    sd = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 2)[0] not in adapted}
    sd = {k: v for k, v in sd.items() if k.rsplit(".", 1)[0] not in adapted}
    for name, module in adapted.items():
        sd[f"{name}.weight"] = module.merged_weight().detach()
    return sd


def memory_stats(model):
    """Parameters that train vs those full fine-tuning would train (every parameter but the
    adapters, tied weights counted once), and the bytes each way of AdamW's two fp32 moments
    and of the fp32 gradients."""
    params = list(model.parameters())  # unique: a tied weight appears once
    adapter_ids = {id(m.lora_A) for m in model.modules() if isinstance(m, LoRALinear)}
    adapter_ids |= {id(m.lora_B) for m in model.modules() if isinstance(m, LoRALinear)}
    trainable = sum(p.numel() for p in params if p.requires_grad)
    full = sum(p.numel() for p in params if id(p) not in adapter_ids)
    return dict(
        trainable=trainable,
        full=full,
        adam_bytes=8 * trainable,  # exp_avg and exp_avg_sq, 4 bytes each
        adam_bytes_full=8 * full,
        grad_bytes=4 * trainable,
        grad_bytes_full=4 * full,
    )


def memory_report(model):
    """One line for a training script's startup print."""
    s, MiB = memory_stats(model), 2**20
    return (
        f"trainable {s['trainable'] / 1e6:.2f}M of {s['full'] / 1e6:.2f}M parameters "
        f"({100 * s['trainable'] / s['full']:.2f}%): AdamW state {s['adam_bytes'] / MiB:.1f} MiB "
        f"(full fine-tuning {s['adam_bytes_full'] / MiB:.1f} MiB), gradients "
        f"{s['grad_bytes'] / MiB:.1f} MiB (full {s['grad_bytes_full'] / MiB:.1f} MiB)"
    )
