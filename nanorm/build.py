"""
The data, the reward model and the optimizer a train_rm.py run builds from its options: the
class its flags choose (the plain RM, the LM-regularized one, ODIN's length head, the subset
experts), the checkpoint it starts from, what is frozen (--train_layers), LoRA's adapters, the
cache of the frozen layers' output, AdamW's parameter groups. A feature behind a flag is
imported where its flag is handled, so a default run loads only what it runs.

    meta, train, val = load_data(cfg, proc)           # the prepared pairs (rank 0 builds arith)
    rm = build_model(cfg, meta, (train, val))         # on the CPU, frozen weights marked
    options = model_options(rm, cfg)                  # the model's own loss() options
    train_cache, val_cache = open_caches(cfg, proc, rm, train, val, say)
    optimizer = make_optimizer(rm, cfg, device)       # AdamW, decay on matrices alone

A first reading can skip this file: train_rm.py's loop is the same for every model built here.
"""

import os

import torch
import torch.distributed as dist

from data.pairs import DATA, dataset_dir, open_dataset
from model import ModelConfig
from nanorm.base.command import UsageError
from nanorm.ckpt import check_tokenizer
from reward import LMRegularizedRewardModel, RewardModel

# model shapes for --init scratch (a loaded checkpoint brings its own shape)
MODELS = {
    "nano": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2),  # ~0.2M params, CPU minutes
    "tiny": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2),
    "small": dict(dim=288, n_layers=6, n_heads=6, n_kv_heads=6),  # llama2.c's stories15M shape
    "medium": dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8),
}


def load_data(cfg, proc):
    """(meta.json's dict, train pairs, val pairs)."""
    built = os.path.exists(os.path.join(DATA, "arith", "meta.json"))
    if proc.master and cfg.dataset == "arith" and not built:
        from data.arith.prepare import built_in  # labels pairs with verifiable.py: only if missing

        built_in()  # the default data makes itself when missing; rank 0 alone writes it
    if proc.ddp:
        dist.barrier()  # the other ranks wait for it, then everyone reads the same files
    d, meta, (train, val) = open_dataset(cfg.dataset, "train", "val")
    G = cfg.batch_size * cfg.grad_accum * proc.world
    if len(train) < G:
        raise UsageError(
            f"{d} has {len(train)} training pairs, fewer than one global batch of {G}: "
            "lower --batch_size or --grad_accum"
        )
    if len(val) == 0:
        raise UsageError(
            f"{d} has no held-out pairs (val.npz): prepare it with a larger --val_frac"
        )
    return meta, train, val


def build_model(cfg, meta, data=()):
    """The reward model, on the CPU, its frozen weights marked requires_grad=False; data (the
    pair datasets it will read): their longest row must fit the model's max_seq_len."""
    Model = LMRegularizedRewardModel if cfg.lm_coef > 0 else RewardModel
    if cfg.length_head:
        from nanorm.length_head import LengthDebiasedRewardModel  # --length_head

        if Model is not RewardModel:
            raise UsageError("--length_head is a second head of the plain RM: use --lm_coef 0")
        Model = LengthDebiasedRewardModel
    if cfg.subset_experts:
        from nanorm.subset_experts import SubsetExpertsRewardModel  # --subset_experts

        if Model is not RewardModel:
            raise UsageError("--subset_experts: a plain RM's heads, use --lm_coef 0 alone")
        if len(meta.get("groups") or []) < 2:
            raise UsageError(
                f"--subset_experts: {cfg.dataset}'s meta.json names no subsets (groups): "
                "prepare data from several sources, or leave the flag out"
            )
        Model = SubsetExpertsRewardModel
    if cfg.pack and Model is LMRegularizedRewardModel:
        raise UsageError("--pack packs the plain reward model's pair: use it with --lm_coef 0")
    if cfg.init != "scratch" and not os.path.exists(cfg.init):
        raise UsageError(f"--init {cfg.init} not found (a .bin/.pt, .gguf, HF or Meta dir)")
    # before the weights are read: data of another vocabulary fails fast
    check_tokenizer(cfg.init, meta, dataset_dir(cfg.dataset))
    if cfg.init == "scratch":
        shape = dict(MODELS[cfg.model], multiple_of=32, max_seq_len=cfg.max_seq_len)
        rm = Model.from_config(
            ModelConfig(**shape, vocab_size=meta["vocab_size"], dropout=cfg.dropout)
        )
    else:  # any checkpoint: a foreign backbone gets a new head; our ckpt.pt gives its heads
        try:
            rm = Model(pretrained=cfg.init).train()
        except ValueError as e:  # the readers' "wrong format, shapes do not fit": one line
            raise UsageError(str(e) if cfg.init in str(e) else f"{cfg.init}: {e}") from None
    if cfg.subset_experts:
        rm.set_experts(len(meta["groups"]))
    longest = max((int(d.lengths(cfg.pack).max(initial=0)) for d in data), default=0)
    limit = rm.backbone.config.max_seq_len
    if longest > limit:  # prepare's --max_len and the model's max_seq_len are set apart
        fix = f", or --max_seq_len {longest}" if cfg.init == "scratch" else ""
        raise UsageError(
            f"{cfg.dataset} holds rows of {longest} tokens (prepared with --max_len "
            f"{meta.get('max_len', '?')}), longer than the model's max_seq_len {limit}: prepare it "
            f"with --max_len {limit}{fix}"
        )
    vocab = rm.backbone.config.vocab_size
    if vocab < meta["vocab_size"]:
        raise UsageError(
            f"{cfg.init} has vocab_size {vocab}, the data's tokenizer {meta['tokenizer']} "
            f"has {meta['vocab_size']}"
        )
    if cfg.train_layers:
        train_top_layers(rm, cfg.train_layers)
    if cfg.lora_rank:  # on the trained layers (all, without --train_layers); the head trains
        from nanorm.lora import add_lora, memory_report  # --lora_rank

        n = len(rm.backbone.layers)
        add_lora(rm, cfg.lora_rank, cfg.lora_alpha, range(n - (cfg.train_layers or n), n))
        print(memory_report(rm))
    if Model is not LMRegularizedRewardModel and not rm.backbone.config.tie_embeddings:
        # a plain reward model never uses the LM head: freeze it, or DDP waits for its gradient
        rm.backbone.output.weight.requires_grad_(False)
    if cfg.center_coef == 0 and rm.head.bias is not None:
        # a constant added to every reward cancels in r_c - r_r, so the head's bias gets a zero
        # gradient plus float noise, which Adam would blow up into steps of size lr. Centering
        # (center_coef > 0) is what gives the bias something to learn.
        rm.head.bias.requires_grad_(False)
    rm.backbone.gradient_checkpointing = cfg.grad_ckpt
    return rm.train()


def train_top_layers(rm, n):
    """Train only the top n layers, the final norm and the head. What is frozen gets no
    gradient, so autograd keeps no activations below the first trained layer (the bottom
    layers run as inference), and it stays out of the optimizer."""
    layers = rm.backbone.layers
    if not 0 < n <= len(layers):
        raise UsageError(f"--train_layers {n}: the model has {len(layers)} layers")
    rm.requires_grad_(False)
    for module in (*layers[len(layers) - n :], rm.backbone.norm, *heads_of(rm)):
        module.requires_grad_(True)


def heads_of(rm):
    """rm.head and the heads beside it (--length_head's, --subset_experts' experts and gate)."""
    return [
        rm.head,
        *filter(None, (getattr(rm, k, None) for k in ("length_head", "experts", "gate"))),
    ]


def open_caches(cfg, proc, rm, train, val, say):
    """(train, val) cache.FrozenCache of the frozen layers' output, when --train_layers freezes
    some and the model reads the last layer at the reward tokens alone (the plain RM, ODIN's; the
    LM term reads every token); else (None, None). A cached run trains and evaluates on packed
    rows, an exact re-layout (main sets --pack)."""
    reads_ends = not isinstance(rm, LMRegularizedRewardModel)  # the plain RM's, ODIN's
    if not (cfg.cache and cfg.train_layers and reads_ends and cfg.init != "scratch"):
        return None, None
    from nanorm.cache import open_caches_of  # --train_layers on a pretrained model

    d = dataset_dir(cfg.dataset)
    first = len(rm.backbone.layers) - cfg.train_layers
    return open_caches_of(rm.backbone, cfg.init, d, first, train, val, proc, cfg.cache_dir, say)


def model_options(rm, cfg=None):
    """The options of the model's own loss() that the flags set: the LM term's weight, ODIN's,
    the gate's (None: the model's default). Without flags (a trainer built in Python) the
    LM-regularized model's loss is LLMBook's rm_loss + lm_loss, lm_coef 1."""
    options = {}
    if isinstance(rm, LMRegularizedRewardModel):
        options["lm_coef"] = cfg.lm_coef if cfg is not None else 1.0
    if cfg is not None and cfg.length_head and cfg.length_coef is not None:
        options["length_coef"] = cfg.length_coef
    if cfg is not None and cfg.subset_experts and cfg.gate_coef is not None:
        options["gate_coef"] = cfg.gate_coef
    return options


def make_optimizer(rm, cfg, device):
    """AdamW on the weights that train, with decay on matrices only (never norms and biases);
    --head_lr: every head at its own peak, on the same schedule. Each group's initial_lr is its
    peak, which the scheduler (LambdaLR) scales."""
    head = {id(p) for m in heads_of(rm) for p in m.parameters()} if cfg.head_lr else set()
    params = [p for p in rm.parameters() if p.requires_grad]
    body = [p for p in params if id(p) not in head]
    groups = [
        {"params": [p for p in body if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in body if p.dim() < 2], "weight_decay": 0.0},
    ]
    if head:
        heads = [p for p in params if id(p) in head]
        groups.append({"params": heads, "weight_decay": 0.0, "lr": cfg.head_lr})
    for g in groups:
        g["initial_lr"] = g.get("lr", cfg.lr)
    fused = device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused)
