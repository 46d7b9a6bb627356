"""
A reward model with one expert head per subset of its training data and a gate that reads, from
the text alone, which kind of conversation it is scoring. Trained by
`python train_rm.py --subset_experts` on data whose pairs carry subsets (HH-RLHF's four).

    rm = SubsetExpertsRewardModel(backbone, n_experts=4)
    r = rm(input_ids, attention_mask)                          # (B,) as RewardModel's
    loss, stats = rm.loss_packed(tokens, segments, positions, chosen_end, rejected_end,
                                 groups=subset_of_each_pair)

Why: the subsets of a preference dataset can disagree. HH-RLHF's helpful subsets reward the
fuller answer, its harmless subset the refusal of a harmful request; one linear head on the
union learns the majority's taste and loses the minority (bench/recipes/README.md). A head
per subset, mixed by how sure the model is that the prompt is of that subset, lets one model
hold both tastes: the reward is

    r(h) = head(h) + sum_k softmax(gate(h))_k * experts(h)_k

with h the final state at the reward token, the state RewardModel's head reads: the shared
head learns what every subset agrees on, each expert what its subset adds. The gate is taught
the subset of each pair by a cross-entropy term (both responses of a pair are of its subset),
so at scoring time it needs no label: forward(input_ids, attention_mask) is RewardModel's.
This is ArmoRM's idea (Wang et al. 2024, arXiv 2406.12845: objective heads mixed by a gate
that reads the prompt) with the data's subsets as the objectives.
"""

import torch
import torch.nn.functional as F
from torch import nn

from reward import RewardModel, apply_head, last_real_index, pad_and_concat, pairwise_objective

GATE_COEF = 1.0  # weight of the gate's cross-entropy beside the pairwise loss


class SubsetExpertsRewardModel(RewardModel):
    def __init__(self, backbone=None, *, n_experts=None, **kwargs):
        """RewardModel's constructor; n_experts (default: a pretrained model's number, else 4)."""
        super().__init__(backbone, **kwargs)
        if n_experts is not None and n_experts != self.experts.out_features:
            self.set_experts(n_experts)

    def add_heads(self, dim, device, heads):
        super().add_heads(dim, device, heads)
        self.set_experts(len(heads["gate.bias"]) if "gate.bias" in heads else 4)

    def set_experts(self, n):
        """n experts and an n-way gate, new: the experts start at 0 (the model starts as the
        plain RM), the gate uniform."""
        dim, device = self.backbone.config.dim, self.head.weight.device
        self.experts, self.gate = nn.Linear(dim, n).to(device), nn.Linear(dim, n).to(device)
        for layer in (self.experts, self.gate):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """A checkpoint's own number of experts, whatever this model was built with."""
        w = state_dict.get("experts.weight")
        if w is not None and w.size(0) != self.experts.out_features:
            self.set_experts(w.size(0))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def reward_and_gate(self, h):
        """(reward (...,), gate logits (..., K)) from final states h (..., dim), in fp32 with
        autocast off, as apply_head."""
        with torch.autocast(h.device.type, enabled=False):
            h = h.to(self.head.weight.dtype)
            logits = self.gate(h)
            mixed = (logits.softmax(-1) * self.experts(h)).sum(-1)
            return apply_head(self.head, h) + mixed, logits

    def score(self, h):
        """The reward of final states h (..., dim): what RewardModel's forwards read."""
        return self.reward_and_gate(h)[0]

    def loss(
        self,
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_response_mask=None,
        loss_fn=None,
        groups=None,
        gate_coef=GATE_COEF,
    ):
        """(objective, stats) on a right-padded pair batch: see loss_packed."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        h = self.backbone.hidden_states(tokens, mask, at=last_real_index(mask)[:, None])[:, 0]
        B = chosen.size(0)
        h = torch.stack([h[:B], h[B:]], 1)  # (B, 2, dim): chosen, rejected
        return self._objective(h, groups, loss_fn, gate_coef)

    def loss_packed(
        self,
        tokens,
        segments,
        positions,
        chosen_end,
        rejected_end,
        loss_fn=None,
        flex=False,
        states=None,
        groups=None,
        gate_coef=GATE_COEF,
    ):
        """(pairwise loss + gate_coef * the gate's cross-entropy against groups (B,), the
        subset of each pair, over both of its responses; stats with gate_loss and gate_acc)."""
        ends = (chosen_end, rejected_end)
        h = self.packed_end_states(tokens, segments, positions, *ends, flex, states)  # (B, 2, dim)
        return self._objective(h, groups, loss_fn, gate_coef)

    def _objective(self, h, groups, loss_fn, gate_coef):
        if groups is None:
            raise ValueError("the subset experts need each pair's subset: data with groups")
        r, logits = self.reward_and_gate(h)  # (B, 2), (B, 2, K)
        loss, stats = pairwise_objective(loss_fn, r[:, 0], r[:, 1])
        target = groups.to(logits.device)[:, None].expand(-1, 2)  # a pair's subset is both's
        gate_loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        gate_acc = (logits.argmax(-1) == target).float().mean()
        stats.update(gate_loss=gate_loss.detach(), gate_acc=gate_acc)
        return loss + gate_coef * gate_loss, stats
