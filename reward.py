"""
Reward models: a LLaMA that reads prompt + response and returns one number, and the pairwise
losses that teach it which of two responses people preferred.

A library: score.py is its command line (score a response, export to Hugging Face).

    rm = RewardModel(pretrained=path)                  # any checkpoint; or RewardModel(backbone)
    r = rm(input_ids, attention_mask)                  # (B,), read at each row's last real token
    r_c, r_r = rm.forward_pair(chosen, chosen_mask, rejected, rejected_mask)  # one backbone call
    loss = LogSigLoss()(r_c, r_r)                      # ColossalChat's loss modules; or
    loss = pairwise_loss("logsig", r_c, r_r, margin=None, center_coef=0.0)   # the function
    ir = ImplicitReward(policy, reference, beta=0.1, scoring="sum")  # DPO's reward of a policy
    r = ir(input_ids, attention_mask, response_mask)   # (B,); ir.loss(...) is DPO's loss
    prm = ProcessRewardModel(backbone)                 # a reward per step: step_scores(...)
    judge = GenerativeJudge(policy, yes_id, no_id)     # p("Yes") to a question, as the reward
    ens = RewardEnsemble([rm1, rm2, rm3], rule="min")  # K models, one conservative reward

Pooling. The reward is the head applied to the hidden state of the last real token (the EOS that
data/pairs.py appends), found from the attention mask, never from a pad id: when pad == eos
(LLaMA has no pad token), searching for the pad id finds the EOS itself or a padding token.
With positions derived from the mask in model.py, left, right and no padding give one reward.

beta. LogSigLoss(beta) takes ColossalChat's `beta` and, like it, does not use it:
-logsigmoid(beta * (r_c - r_r)) is the beta = 1 loss of a head whose weights are multiplied by
beta, so beta would only rescale the rewards (and the head's effective learning rate), which the
head learns anyway. The beta that matters is DPO's, where the "reward" is
beta * log(pi / pi_ref) and the policy cannot rescale it freely.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from data.pairs import packed_attention_mask, packed_block_mask, right_pad
from model import ModelConfig, Transformer
from nanorm.base.checkpoints import Checkpoint, load, model_config
from nanorm.base.command import UsageError
from nanorm.base.compat import LLMBOOK_ARGS, from_pretrained_dtype, is_llmbook_call, llmbook_inputs

LOSSES = ("logsig", "logexp", "bce")
LM_CHUNK = 1024  # response tokens per LM-head call: at most (LM_CHUNK, vocab) logits alive


# ----------------------------------------------------------------------------- heads and pooling
def new_head(dim, bias=True):
    """A Linear(dim, 1) scoring head, weights N(0, std=1/(dim+1)) as ColossalChat initialises it.

    Why so small: the final RMSNorm makes |h| about sqrt(dim), so the initial score w.h has a
    standard deviation near 1/sqrt(dim). Rewards start close to 0 at any width, the first loss
    is about log 2, and the sigmoid is not saturated before training has begun."""
    head = nn.Linear(dim, 1, bias=bias)
    nn.init.normal_(head.weight, mean=0.0, std=1.0 / (dim + 1))
    if bias:
        nn.init.zeros_(head.bias)
    return head


def last_real_index(attention_mask):
    """(B,) index of each row's last real token (the largest t with mask[b, t] = 1), whatever the
    padding side. A row with no real token gives 0: the caller must not send empty rows."""
    t = torch.arange(attention_mask.size(1), device=attention_mask.device)
    return (t * attention_mask.bool()).max(dim=-1).values


def apply_head(head, h):
    """head(h).squeeze(-1) in the head's dtype with autocast off: the head stays fp32 under bf16
    autocast, since a bf16 reward keeps 8 bits and r_c - r_r of close pairs would round away."""
    with torch.autocast(h.device.type, enabled=False):
        return head(h.to(head.weight.dtype)).squeeze(-1)


def score_last_token(head, h, attention_mask):
    """head applied to h (B, T, dim) at each row's last real token (the last column without a
    mask) -> (B,)."""
    if attention_mask is None:
        last = h[:, -1]  # (B, dim)
    else:
        last = h[torch.arange(h.size(0), device=h.device), last_real_index(attention_mask)]
    return apply_head(head, last)  # (B,)


def flex_pays(tokens):
    """Whether packed rows attend through FlexAttention's block mask (flex=True below): on CUDA
    under bf16 autocast, where it skips the masked blocks. In fp32 the dense mask is exact and
    cheap enough, and Inductor found no fp32 kernel configuration for it on an H200 (torch 2.11)."""
    return tokens.is_cuda and torch.is_autocast_enabled("cuda")


def pad_and_concat(a, a_mask, b, b_mask):
    """Stack two (B, Ta) and (B, Tb) batches into one (2B, max(Ta, Tb)) batch: the shorter is
    right-padded with token 0 and mask 0, which changes nothing since we pool by the mask."""
    a_mask = torch.ones_like(a) if a_mask is None else a_mask
    b_mask = torch.ones_like(b) if b_mask is None else b_mask
    if a.size(1) == b.size(1):  # as collate makes them: nothing to pad
        return torch.cat([a, b]), torch.cat([a_mask.long(), b_mask.long()])  # (2B, T)
    return right_pad([*a, *b]), right_pad([*a_mask.long(), *b_mask.long()])  # (2B, T)


# ----------------------------------------------------------------------------- losses
def pairwise_loss(kind, r_chosen, r_rejected, labels=None, margin=None, center_coef=0.0):
    """The pairwise loss `kind` in LOSSES on the difference d = r_chosen - r_rejected - margin:

        logsig  mean of -log sigmoid(d)                      Bradley-Terry's likelihood
        logexp  mean of log(1 + exp(-d))                     ColossalChat's writing
        bce     mean of -[y log s + (1 - y) log(1 - s)]      s = sigmoid(d), y = labels

    plus center_coef * mean((r_c + r_r)^2). They are one function: -log sigmoid(d) =
    log(1 + e^-d) = BCE(d, y = 1), with the gradient -sigmoid(-d) / B on r_c and its negative on
    r_r, and log 2 at d = 0. So bce with its default label 1, the first argument preferred, is
    logsig; label 0 is logsig of the swapped pair, and soft labels in [0, 1] blend the two.
    logexp is computed as logaddexp(0, -d), which never forms exp, so it stays finite at
    d = -1e4 where log(1 + exp(-d)) is inf.

    margin m (B,) or a number: Llama 2 asks for a larger gap on pairs the annotators rated
    "significantly better". Centering (Eisenstein et al. 2023) pins the free offset of the
    rewards near 0: the pairwise loss only sees differences, so without it they can drift."""
    d = r_chosen - r_rejected
    if margin is not None:
        d = d - margin
    if labels is not None and kind != "bce":
        raise ValueError(f"labels are for the bce loss; {kind!r} takes the chosen first")
    if kind == "logsig":
        loss = -F.logsigmoid(d).mean()
    elif kind == "logexp":
        loss = torch.logaddexp(torch.zeros_like(d), -d).mean()
    elif kind == "bce":
        labels = torch.ones_like(d) if labels is None else labels.to(d.dtype)
        loss = F.binary_cross_entropy_with_logits(d, labels)
    else:
        raise ValueError(f"unknown loss {kind!r}; choose one of {LOSSES}")
    if center_coef:
        loss = loss + center_coef * (r_chosen + r_rejected).pow(2).mean()
    return loss


class PairwiseLoss(nn.Module):
    """pairwise_loss(kind) as a module, called as ColossalChat's trainer calls its loss_fn:
    loss_fn(chosen_reward, reject_reward) -> a scalar. margin and center_coef are fixed at
    construction (a per-pair margin (B,) may be passed to the call instead). One
    implementation: the module calls pairwise_loss."""

    kind = "logsig"
    reduction = "mean"  # a scalar, as torch's loss modules say it

    def __init__(self, kind=None, margin=None, center_coef=0.0):
        super().__init__()
        self.kind = kind or self.kind
        if self.kind not in LOSSES:
            raise ValueError(f"unknown loss {self.kind!r}; choose one of {LOSSES}")
        self.margin, self.center_coef = margin, center_coef

    def forward(self, chosen_reward, reject_reward, margin=None):
        margin = self.margin if margin is None else margin
        return pairwise_loss(
            self.kind, chosen_reward, reject_reward, margin=margin, center_coef=self.center_coef
        )


class LogSigLoss(PairwiseLoss):
    """ColossalChat's LogSigLoss: mean of -log sigmoid(chosen_reward - reject_reward). `beta` is
    accepted and unused, as there (see the module's docstring on why it would only rescale)."""

    kind = "logsig"

    def __init__(self, beta=0.1, margin=None, center_coef=0.0):
        super().__init__("logsig", margin, center_coef)
        self.beta = beta


class LogExpLoss(PairwiseLoss):
    """ColossalChat's LogExpLoss: mean of log(1 + exp(reject_reward - chosen_reward)), the same
    function as LogSigLoss, computed without forming exp (finite where the formula overflows)."""

    kind = "logexp"

    def __init__(self, margin=None, center_coef=0.0):
        super().__init__("logexp", margin, center_coef)


def pairwise_objective(loss_fn, r_chosen, r_rejected):
    """(loss_fn(r_chosen, r_rejected), stats): what a plain reward model's loss() returns. stats
    hold detached tensors, the ones train_rm.py logs: the rewards, the pairwise loss, the
    accuracy. loss_fn None: LogSigLoss()."""
    loss = (loss_fn or LogSigLoss())(r_chosen, r_rejected)
    return loss, pair_stats(r_chosen, r_rejected, loss)


def pair_stats(r_chosen, r_rejected, rm_loss, **more):
    """The detached figures every loss() returns beside its objective."""
    stats = dict(r_chosen=r_chosen, r_rejected=r_rejected, rm_loss=rm_loss, **more)
    stats["accuracy"] = accuracy(r_chosen, r_rejected)
    return {k: v.detach() for k, v in stats.items()}


def accuracy(r_chosen, r_rejected):
    """Fraction of pairs with r_c > r_r, strictly: a tie is not a correct ranking (a model that
    gives every response 0 would otherwise be 100% accurate)."""
    return ranked_right(r_chosen, r_rejected).float().mean()


def ranked_right(r_chosen, r_rejected):
    """(B,) bool: the pairs ranked right, r_c > r_r strictly; every accuracy counts these."""
    return r_chosen > r_rejected


def pearson(x, y, eps=1e-8):
    """Pearson correlation of two (N,) tensors, differentiable (ODIN's statistic in a batch);
    report.py reports it between rewards and lengths."""
    x, y = x - x.mean(), y - y.mean()
    return (x * y).sum() / (x.norm() * y.norm() + eps)


def chunked_cross_entropy(lm_head, h, labels, chunk):
    """Per-token cross-entropy (N,) of lm_head(h) (N, dim) against labels (N,), `chunk` rows at a
    time. At a real vocabulary the logits are the memory: 1024 tokens x 49k entries is 200 MB
    in fp32. Each chunk is checkpointed, so the forward keeps only its (chunk, dim) input and the
    backward recomputes one chunk's logits at a time; values and gradients are the full ones."""

    def ce(h, y):  # fp32 softmax: bf16 logits would round the log-probabilities
        return F.cross_entropy(lm_head(h).float(), y, reduction="none")

    pieces = [
        checkpoint(ce, h[i : i + chunk], labels[i : i + chunk], use_reentrant=False)
        for i in range(0, h.size(0), chunk)
    ]
    return torch.cat(pieces) if pieces else h.new_zeros(0)


# ----------------------------------------------------------------------------- DPO's reward
SCORINGS = ("sum", "mean", "ref_free")  # how ImplicitReward reads a policy (RewardBench's three)


def response_logprobs(logits, input_ids, response_mask):
    """(log-probability (B,), response tokens (B,)): the log-probability a causal LM's logits
    (B, T, vocab) give the tokens of input_ids (B, T) where response_mask is 1, summed per row,
    and how many there are. logits[:, t] predict input_ids[:, t + 1], so each response token is
    read from the column before it; the mask skips the prompt and padding on either side."""
    logp = torch.log_softmax(logits[:, :-1].float(), -1)  # fp32: a sum of many rounded terms
    logp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T - 1)
    m = response_mask[:, 1:].to(logp.dtype)
    return (logp * m).sum(1), m.sum(1)


def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta=0.1):
    """DPO's loss (Rafailov et al. 2023) from each response's summed log-probability (B,) under
    the policy and the frozen reference:

        -log sigmoid(beta * [log pi/pi_ref (y_c | x) - log pi/pi_ref (y_r | x)])

    The policy that maximises reward - KL/beta to the reference satisfies r(x, y) = beta *
    log(pi(y|x) / pi_ref(y|x)) + a term of x alone, which cancels in r_c - r_r. So DPO is the
    Bradley-Terry loss of a reward model whose reward is that log-ratio: pairwise_loss, fed
    the implicit rewards. Without the reference, the policy is pushed to raise log pi(y_c)
    anywhere, not relative to where it started; beta sets how far a given margin moves it."""
    r_chosen = beta * (logp_chosen - ref_logp_chosen)
    r_rejected = beta * (logp_rejected - ref_logp_rejected)
    return pairwise_loss("logsig", r_chosen, r_rejected)


class ImplicitReward(nn.Module):
    """A policy read as a reward model: r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x)), one
    number per row, called like the reward models with a response_mask (B, T) too, 1 on the
    response's tokens (the prompt is given, not scored). scoring, as RewardBench scores DPO
    models:
        sum       beta * the log-ratio summed over the response: the reward DPO trains
        mean      the same per response token: longer responses are not favoured for length
        ref_free  beta * log pi(y|x), the policy alone: what is left without the reference
    The policy is `backbone`, the name every reward model gives its LLaMA, so a checkpoint
    holds it under the same keys (nanorm/ckpt.py stores the reference beside it). The
    reference is frozen and stays in eval mode. Simplified: the full logits (B, T, vocab) are
    made, fine at a small vocabulary (LMRegularizedRewardModel's chunked LM head is the way at
    a large one), and the reference runs every step rather than once per pair."""

    def __init__(self, policy, reference, beta=0.1, scoring="sum"):
        super().__init__()
        if scoring not in SCORINGS:
            raise ValueError(f"scoring {scoring!r} is not one of {SCORINGS}")
        if not beta > 0:  # (a NaN fails here too)
            raise ValueError(f"beta must be > 0, got {beta}")
        self.backbone, self.reference = policy, reference.requires_grad_(False).eval()
        self.beta, self.scoring = float(beta), scoring

    def train(self, mode=True):
        super().train(mode)
        self.reference.eval()  # frozen: no dropout, whatever the policy does
        return self

    def log_probs(self, input_ids, attention_mask, response_mask):
        """(log pi(y|x), log pi_ref(y|x), response tokens), each (B,)."""
        logits = self.backbone(input_ids, attention_mask)
        logp, n = response_logprobs(logits, input_ids, response_mask)
        with torch.no_grad():  # the reference is a constant of training
            ref_logits = self.reference(input_ids, attention_mask)
            ref, _ = response_logprobs(ref_logits, input_ids, response_mask)
        return logp, ref, n

    def forward(self, input_ids, attention_mask=None, response_mask=None, **kwargs):
        """Rewards (B,) of the rows' responses, by self.scoring. Other keywords are ignored, as
        RewardModel ignores them (it ignores response_mask too: a caller may pass it to both)."""
        return self.scores(input_ids, attention_mask, response_mask)[self.scoring]

    def scores(self, input_ids, attention_mask, response_mask):
        """{scoring: rewards (B,)} for every scoring, from one policy and one reference call."""
        if response_mask is None:
            raise ValueError("an implicit reward needs response_mask: 1 on the response's tokens")
        logp, ref, n = self.log_probs(input_ids, attention_mask, response_mask)
        ratio = logp - ref  # (B,) log pi(y|x) / pi_ref(y|x)
        return {
            "sum": self.beta * ratio,
            "mean": self.beta * ratio / n.clamp(min=1),  # a response of no tokens scores 0
            "ref_free": self.beta * logp,
        }

    def rows(self, chosen, chosen_mask, rejected, rejected_mask, chosen_resp, rejected_resp):
        """The 2B rows of a pair batch (chosen rows, then rejected) with their response masks."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        _, response = pad_and_concat(chosen, chosen_resp, rejected, rejected_resp)  # (2B, T)
        return tokens, mask, response

    def forward_pair(self, *pair):
        """(r_chosen, r_rejected), each (B,), from one call on the 2B rows. pair: chosen,
        chosen_mask, rejected, rejected_mask, chosen_response_mask, rejected_response_mask."""
        r = self(*self.rows(*pair))  # (2B,)
        B = pair[0].size(0)
        return r[:B], r[B:]

    def loss(self, *pair):
        """(DPO's loss, stats) on a pair batch (forward_pair's arguments): dpo_loss on the
        summed log-probabilities, one policy call and one reference call on the 2B rows. DPO
        trains the sum whatever self.scoring; the stats' rewards are the sum's."""
        B = pair[0].size(0)
        logp, ref, _ = self.log_probs(*self.rows(*pair))  # (2B,) each
        loss = dpo_loss(logp[:B], logp[B:], ref[:B], ref[B:], self.beta)
        r = self.beta * (logp - ref)
        return loss, pair_stats(r[:B], r[B:], loss)


# ----------------------------------------------------------------------------- the models
# heads a checkpoint of another class holds that a model starting from it does not read, and why
# (a class's own checkpoint gives all its heads; any other tensor is refused by name)
STARTS_WITHOUT = {
    "head.bias": "a constant offset of every reward, which pairwise losses never see; "
    "a head without a bias (LMRegularizedRewardModel's) cannot hold it",
    "length_head.": "ODIN's length head, read by its training alone (nanorm/length_head.py)",
    "experts.": "the subset experts' mixture: another class starts from the shared head",
    "gate.": "the subset experts' gate: another class starts from the shared head",
    "reference.": "DPO's frozen reference policy, which its implicit reward alone reads",
}


class ScalarHeadModel(nn.Module):
    """A LLaMA backbone with a Linear(dim, 1) `head`: the reward models here and critic.Critic.
    It owns construction; a subclass says where the head reads (forward). Files are read below
    it (nanorm/base/checkpoints.py: load), checkpoints written above it (nanorm/ckpt.py)."""

    head_bias = True

    def __init__(self, backbone=None, *, pretrained=None, config=None, torch_dtype=None, **kwargs):
        """cls(backbone) puts a new head on a LLaMA. cls(pretrained=path) (or cls(path)), as
        ColossalChat builds its models, reads any checkpoint nanoRM reads (ckpt.pt, llama2.c
        .bin/.pt, Meta or HF directory, ColossalChat's RewardModel, .gguf) with its heads where
        it has them; pretrained may also be a checkpoints.Checkpoint already read. With config=
        too, config is the shape the weights are read into (ColossalChat's from_pretrained(
        pretrained, config=config)); alone, cls(config=c) (or cls(c), as LLMBook builds its model)
        is a new model of that shape. c: a model.ModelConfig or a transformers LlamaConfig.
        torch_dtype (or dtype, its newer name): the backbone's dtype; the head stays float32, as
        ColossalChat's value head does. Any other keyword ColossalChat passes to from_pretrained
        (use_flash_attention_2, ...) is refused by name: nothing here would honour it. A hub name
        is not read: download it first (huggingface-cli download NAME --local-dir DIR)."""
        super().__init__()
        dtype = from_pretrained_dtype(type(self).__name__, torch_dtype, kwargs)
        if isinstance(backbone, (str, os.PathLike, Checkpoint)):
            backbone, pretrained = None, backbone
        elif backbone is not None and not isinstance(backbone, Transformer):
            backbone, config = None, backbone  # a config, positional
        if backbone is not None and (pretrained is not None or config is not None):
            raise TypeError(f"{type(self).__name__}(backbone) takes no pretrained= or config=")
        if backbone is None and pretrained is None and config is None:
            raise TypeError(f"{type(self).__name__}(backbone), (pretrained=path) or (config=c)")
        loaded = pretrained
        if isinstance(pretrained, Checkpoint):
            if config is not None or dtype is not None:
                raise TypeError("a Checkpoint is read already: config= and torch_dtype= are load's")
        elif pretrained is not None:
            loaded = load(pretrained, config=config, dtype=dtype)
        elif config is not None:
            backbone = Transformer(model_config(config))
            if dtype is not None:
                backbone = backbone.to(dtype)
        heads = {}
        if loaded is not None:
            backbone, heads = loaded.backbone, self.heads_to_read(loaded)
        self.backbone = backbone
        self.add_heads(backbone.config.dim, backbone.tok_embeddings.weight.device, heads)
        if loaded is not None:
            self.copy_heads(heads, loaded)
            self.eval()

    def heads_to_read(self, loaded):
        """{parameter: tensor} of loaded's heads this model takes: all of them from its own
        class's ckpt.pt, else the scoring head (the bias where this head has one). A tensor
        neither taken nor in STARTS_WITHOUT is refused by name."""
        name = type(self).__name__
        if loaded.kind == name:
            return dict(loaded.heads)
        own = {"head.weight", "head.bias"} if self.head_bias else {"head.weight"}
        heads = {}
        for key, value in loaded.heads.items():
            if key in own:
                heads[key] = value
            elif not key.startswith(tuple(STARTS_WITHOUT)):
                raise UsageError(f"{loaded.path}: tensor {key} has no place in a {name}")
        return heads

    def copy_heads(self, heads, loaded):
        """Copy heads into this model's: its own class's checkpoint must hold exactly its
        heads; every tensor must have its parameter's shape."""
        own = {k for k in self.state_dict() if not k.startswith("backbone.")}
        if loaded.kind == type(self).__name__ and own != heads.keys():
            raise UsageError(
                f"{loaded.path}: its heads {sorted(heads)} do not fit a {type(self).__name__}"
            )
        with torch.no_grad():  # the file's heads: a ckpt.pt's, an HF `score`, a value_head
            for name, value in heads.items():
                p = self.get_parameter(name)
                if p.shape != value.shape:
                    raise UsageError(
                        f"{loaded.path}: {name} is {tuple(value.shape)}, the model's "
                        f"{tuple(p.shape)}"
                    )
                p.copy_(value)

    def add_heads(self, dim, device, heads):
        """New heads on a backbone of width dim: `head`; a subclass adds its own here, shaped
        like the pretrained ones in heads ({name: tensor}, copied in after) where given."""
        self.head = new_head(dim, bias=self.head_bias).to(device)

    def get_input_embeddings(self):
        """The token embedding table (Hugging Face's name for it, as ColossalChat calls it)."""
        return self.backbone.tok_embeddings

    def get_output_embeddings(self):
        """The LM head, the backbone's `output` (tied to the embeddings in llama2.c models)."""
        return self.backbone.output

    @classmethod
    def from_config(cls, cfg: ModelConfig):
        """A freshly initialised model (for tests and training from scratch)."""
        return cls(Transformer(cfg))


class RewardModel(ScalarHeadModel):
    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Rewards (B,) read at each row's last real token (the last column without a mask).
        Only that token's state is computed in the last layer (hidden_states' `at`). Other
        keywords are ignored, as ColossalChat's models ignore them."""
        B, T = input_ids.shape
        if attention_mask is None:
            last = torch.full((B,), T - 1, device=input_ids.device)
        else:
            last = last_real_index(attention_mask)
        h = self.backbone.hidden_states(input_ids, attention_mask, at=last[:, None])  # (B, 1, dim)
        return self.score(h[:, 0])  # (B,)

    def score(self, h):
        """The reward of final states h (..., dim): the head. A model with other heads (the
        subset experts) says here how they make the reward; every forward reads through it."""
        return apply_head(self.head, h)

    def forward_pair(self, chosen, chosen_mask, rejected, rejected_mask):
        """(r_chosen, r_rejected), each (B,), from one backbone call on the 2B rows: half the
        kernel launches of two calls, and one set of activations for the backward pass."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        r = self(tokens, mask)  # (2B,)
        return r[: chosen.size(0)], r[chosen.size(0) :]

    def loss(
        self,
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_response_mask=None,
        loss_fn=None,
    ):
        """(the objective training minimises, stats) on a right-padded pair batch: the pairwise
        loss loss_fn(r_chosen, r_rejected) (default LogSigLoss()). Each model's objective is its
        loss(); train_rm.py calls it and nothing else."""
        r_c, r_r = self.forward_pair(chosen, chosen_mask, rejected, rejected_mask)
        return pairwise_objective(loss_fn, r_c, r_r)

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
    ):
        """loss() on packed rows [prompt | chosen | rejected] (forward_pair_packed's)."""
        ends = (chosen_end, rejected_end)
        r_c, r_r = self.forward_pair_packed(tokens, segments, positions, *ends, flex, states)
        return pairwise_objective(loss_fn, r_c, r_r)

    def forward_pair_packed(
        self, tokens, segments, positions, chosen_end, rejected_end, flex=False, states=None
    ):
        """(r_chosen, r_rejected), each (B,), from rows [prompt | chosen | rejected] packed by
        data/pairs.pack_pairs: the prompt the two responses share runs once, not twice. The
        mask and positions make each token see what it sees in its plain sequence, so the
        rewards equal forward_pair's. flex=True uses FlexAttention (CUDA) for the mask.
        states: (first, (B, T, dim)) the rows' states before layer `first` (cache.py), from
        which the forward runs the layers above it alone."""
        h = self.packed_end_states(
            tokens, segments, positions, chosen_end, rejected_end, flex, states
        )
        r = self.score(h)  # (B, 2)
        return r[:, 0], r[:, 1]

    def packed_end_states(
        self, tokens, segments, positions, chosen_end, rejected_end, flex, states
    ):
        """The final states (B, 2, dim) at the two reward tokens of each packed row, what every
        head on a packed pair reads (forward_pair_packed's arguments)."""
        mask = packed_block_mask(segments) if flex else packed_attention_mask(segments)
        ends = torch.stack([chosen_end, rejected_end], 1)  # (B, 2)
        first, x = states or (0, None)
        return self.backbone.hidden_states(
            tokens,
            segments >= 0,
            positions=positions,
            visible=mask,
            at=ends,
            layers=(first, len(self.backbone.layers)),
            states=x,
        )  # (B, 2, dim)


class LMRegularizedRewardModel(RewardModel):
    """A reward head and the LM head on one LLaMA, after the LLMBook (RUCAIBox) design:

        loss = pairwise_loss(r_c, r_r) + lm_coef * CE(chosen response tokens)

    The LM term keeps the backbone a language model while it learns to score (useful when the
    reward model later initialises the PPO critic, or doubles as the policy). Scoring is
    RewardModel's; only training differs. The published code has three pitfalls, corrected here:
      1. No pooling: reward_head(last_hidden_state).squeeze(-1) is (B, T), one score per token,
         and reward0 - reward1 compares token t of one sequence with token t of the other.
         Corrected: r = head(h[b, last_real_index(mask)[b]]), one number per sequence.
      2. Label 0: its labels are all 0 ("the chosen is in sent1"), but
         BCE-with-logits(r1 - r2, 0) = -log sigmoid(r2 - r1) rewards the *rejected* sequence.
         Corrected: label 1 with the chosen first, i.e. -log sigmoid(r_chosen - r_rejected).
      3. No shift: CrossEntropy(logits[:, t], ids[:, t]) asks each position to copy its own
         input token. Corrected: logits[:, t] predict ids[:, t + 1]; the labels are the
         response tokens only (prompt and padding masked out), averaged over those tokens.
    """

    head_bias = False  # the backbone's `output` Linear is the LM head

    def loss(
        self,
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_response_mask,
        lm_coef,
        loss_fn=None,
    ):
        """(total loss, stats). chosen_response_mask (B, Tc) is 1 on the chosen response's
        tokens (prompt and padding 0); loss_fn the pairwise loss (default LogSigLoss())."""
        lm_rows = (chosen, chosen_mask, chosen, chosen_response_mask)
        return self.rm_and_lm_loss(
            chosen, chosen_mask, rejected, rejected_mask, lm_rows, lm_coef, loss_fn or LogSigLoss()
        )

    def rm_and_lm_loss(
        self, chosen, chosen_mask, rejected, rejected_mask, lm_rows, lm_coef, pair_loss
    ):
        """pair_loss(r_c, r_r) + lm_coef * the LM term, and the stats: the steps loss() and
        llmbook_loss() share. lm_rows = (tokens, mask, targets, response_mask): the rows the LM
        term reads; when they are the chosen rows, their states are the pair forward's. One
        backbone call scores both halves; the LM head runs only where a response token is
        predicted, LM_CHUNK tokens at a time, so no (B, T, vocab) logits exist (at a 49k
        vocabulary they would be the whole memory)."""
        B = chosen.size(0)
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        h = self.backbone.hidden_states(tokens, mask)  # (2B, T, dim)
        r = score_last_token(self.head, h, mask)  # (2B,)
        r_c, r_r = r[:B], r[B:]
        rm_loss = pair_loss(r_c, r_r)
        lm_tokens, lm_mask, targets, response_mask = lm_rows
        same = lm_tokens.shape == chosen.shape and torch.equal(lm_tokens, chosen)
        if same and torch.equal(lm_mask, chosen_mask):  # the chosen rows: their states are here
            h_lm = h[:B, : lm_tokens.size(1)]  # (right padding changes no earlier state)
        else:
            h_lm = self.backbone.hidden_states(lm_tokens, lm_mask)  # (B, T, dim)
        lm_loss = self.response_lm_loss(h_lm, targets, response_mask)
        return rm_loss + lm_coef * lm_loss, pair_stats(r_c, r_r, rm_loss, lm_loss=lm_loss)

    def response_lm_loss(self, h, targets, response_mask):
        """The LM term: mean cross-entropy of the response tokens targets[b, t] (where
        response_mask[b, t] = 1) predicted from the states h[b, t - 1] (B, T, dim)."""
        B = h.size(0)
        # the state at t predicts token t + 1: keep the states whose next token is a response's
        rows, cols = response_mask[:, 1:].nonzero(as_tuple=True)  # (N,) each
        labels = targets[rows, cols + 1]  # (N,)
        ce = chunked_cross_entropy(self.backbone.output, h[rows, cols], labels, LM_CHUNK)  # (N,)
        # mean over each response's tokens, then over pairs: every pair weighs the same, as in
        # the pairwise term. A mean over all tokens of the batch would make micro-batches (and
        # DDP ranks) with fewer tokens count more: gradient accumulation would no longer equal
        # one big batch (the bug Hugging Face's Trainer fixed in late 2024).
        n_tokens = torch.bincount(rows, minlength=B).clamp(min=1)  # (B,)
        per_pair = torch.zeros(B, device=ce.device).index_add(0, rows, ce) / n_tokens
        return per_pair.mean()

    def forward(self, input_ids=None, attention_mask=None, *book_args, **kwargs):
        """RewardModel's rewards (B,); called with LLMBook's arguments (positional, or the
        keywords sent1_idx, ...), the book's combined loss, a scalar (llmbook_loss)."""
        if is_llmbook_call(book_args, kwargs):
            args = (input_ids, attention_mask, *book_args) if input_ids is not None else ()
            return self.llmbook_loss(*args, **kwargs)[0]
        return super().forward(input_ids, attention_mask)

    def llmbook_loss(self, *args, lm_coef=1.0, **kwargs):
        """(loss, stats) from LLMBook's LlamaRewardModel.forward(sent1_idx, attention_mask_1,
        sent2_idx, attention_mask_2, labels, prompt_ids, lm_attn_mask, response_ids), which
        returns rm_loss + lm_loss (nanorm/base/compat.py: llmbook_inputs says how each argument
        is read). Rewards are pooled at each row's last real token (the book scores every
        position). Other keywords (the Trainer's) are ignored."""
        book = {k: kwargs.pop(k) for k in LLMBOOK_ARGS[len(args) :] if k in kwargs}
        pair, lm_rows, target = llmbook_inputs(*args, **book)
        prefer = lambda r_c, r_r: pairwise_loss("bce", r_c, r_r, labels=target)
        return self.rm_and_lm_loss(*pair, lm_rows, lm_coef, prefer)

    def loss_packed(self, *args, **kwargs):
        raise ValueError("the LM term reads every response token: packed rows are for --lm_coef 0")


# ----------------------------------------------------------------------------- beyond one score
class ProcessRewardModel(RewardModel):
    """A reward per reasoning step (Lightman et al. 2023, "Let's verify step by step"): the same
    backbone and head, read at the last token of every step instead of the response's last.
    Each step's score is a logit: sigmoid(score) is the probability that the solution is still
    right after this step (Math-Shepherd's label: could a completion from here reach the right
    answer?). Trained with binary cross-entropy on step labels, hard (0/1) or soft (the share
    of rollouts from the step that reached the answer); a solution's reward is its steps'
    minimum or product (solution_reward)."""

    def step_scores(self, input_ids, attention_mask, step_ends):
        """(B, S) logits at step_ends (B, S), each step's last token; -1 marks no step (rows
        with fewer steps). One backbone call: the last layer runs at those columns alone."""
        B, T = input_ids.shape
        last = (
            torch.full((B,), T - 1) if attention_mask is None else last_real_index(attention_mask)
        )
        at = torch.where(step_ends >= 0, step_ends, last[:, None])  # a real column for no step
        h = self.backbone.hidden_states(input_ids, attention_mask, at=at)
        return self.score(h)  # (B, S)

    def loss(self, input_ids, attention_mask, step_ends, labels):
        """(mean BCE over the real steps, stats). labels (B, S) in [0, 1]."""
        logits, real = self.step_scores(input_ids, attention_mask, step_ends), step_ends >= 0
        loss = F.binary_cross_entropy_with_logits(logits[real], labels[real].float())
        hits = ((logits[real] > 0) == (labels[real] > 0.5)).float().mean()
        return loss, {"loss": loss.detach(), "step_accuracy": hits}


def solution_reward(step_probs, steps, how="min"):
    """(B,) one reward per solution from its steps' probabilities of being right (B, S), where
    `steps` (B, S) marks the real ones. min: a chain is as good as its weakest step (what
    Lightman et al. and Math-Shepherd select by); prod: the probability that every step is
    right, if they were independent (it favours fewer steps). A padded step counts as 1."""
    p = step_probs.masked_fill(~steps.bool(), 1.0)
    if how == "min":
        return p.min(dim=1).values
    if how == "prod":
        return p.prod(dim=1)
    raise ValueError(f"how must be 'min' or 'prod', got {how!r}")


class GenerativeJudge(nn.Module):
    """An LM used as a reward model by asking it (Zhang et al. 2024, generative verifiers): the
    row ends with a question ("Is the answer correct?"), and the reward is the probability the
    LM gives the token that starts "Yes" next, read from its own LM head: no new head, so what
    the policy knows about the answers is used as it is. Fine-tuned with the next-token loss on
    that one position, the "Yes" token for a right answer and the "No" token for a wrong one."""

    def __init__(self, policy, yes_id, no_id):
        super().__init__()
        self.backbone, self.yes_id, self.no_id = policy, int(yes_id), int(no_id)

    def next_logits(self, input_ids, attention_mask=None):
        """(B, vocab) logits of the token after each row's last real token."""
        B, T = input_ids.shape
        last = (
            torch.full((B,), T - 1) if attention_mask is None else last_real_index(attention_mask)
        )
        h = self.backbone.hidden_states(
            input_ids, attention_mask, at=last[:, None].to(input_ids.device)
        )
        return self.backbone.output(h[:, 0]).float()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Rewards (B,) in [0, 1]: p("Yes" | the row)."""
        return self.next_logits(input_ids, attention_mask).softmax(-1)[:, self.yes_id]

    def loss(self, input_ids, attention_mask, labels):
        """(cross-entropy of "Yes" for labels 1 and "No" for labels 0 (B,), stats)."""
        logits = self.next_logits(input_ids, attention_mask)
        target = torch.where(labels.bool(), self.yes_id, self.no_id).to(input_ids.device)
        loss = F.cross_entropy(logits, target)
        says_yes = logits[:, self.yes_id] > logits[:, self.no_id]
        return loss, {"loss": loss.detach(), "accuracy": (says_yes == labels.bool()).float().mean()}


ENSEMBLE_RULES = ("mean", "min", "mean_minus_std")


def conservative_reward(rewards, rule="mean", lam=1.0):
    """(B,) one reward from K models' rewards (K, B) (Coste et al. 2023, reward model ensembles
    against over-optimization): their mean; their minimum (worst case); or mean - lam * std
    (uncertainty-weighted: a response the members disagree on is trusted less). A policy that
    finds a flaw in one member gains little, since the others do not share it."""
    if rule == "mean":
        return rewards.mean(0)
    if rule == "min":
        return rewards.min(0).values
    if rule == "mean_minus_std":
        return rewards.mean(0) - lam * rewards.std(0, unbiased=False)
    raise ValueError(f"rule must be one of {ENSEMBLE_RULES}, got {rule!r}")


class RewardEnsemble(nn.Module):
    """K reward models scored as one by conservative_reward. Members trained apart give rewards
    on different scales, so each is standardised first (reward - shift) / scale, with shift and
    scale (K,) its mean and std on the reference policy's answers (standardise())."""

    def __init__(self, models, rule="mean", lam=1.0):
        super().__init__()
        if rule not in ENSEMBLE_RULES:
            raise ValueError(f"rule must be one of {ENSEMBLE_RULES}, got {rule!r}")
        self.members, self.rule, self.lam = nn.ModuleList(models), rule, float(lam)
        self.register_buffer("shift", torch.zeros(len(models)))
        self.register_buffer("scale", torch.ones(len(models)))

    def member_rewards(self, input_ids, attention_mask=None, **kwargs):
        """(K, B) each member's standardised rewards."""
        r = torch.stack([m(input_ids, attention_mask, **kwargs) for m in self.members])
        return (r - self.shift[:, None]) / self.scale[:, None]

    def standardise(self, input_ids, attention_mask=None, **kwargs):
        """Set shift and scale from the members' raw rewards on these rows."""
        self.shift.zero_(), self.scale.fill_(1.0)
        r = self.member_rewards(input_ids, attention_mask, **kwargs)
        self.shift.copy_(r.mean(1)), self.scale.copy_(r.std(1).clamp(min=1e-6))

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Rewards (B,) by self.rule."""
        return conservative_reward(
            self.member_rewards(input_ids, attention_mask, **kwargs), self.rule, self.lam
        )
