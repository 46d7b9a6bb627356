"""
Reward models: a LLaMA that reads prompt + response and returns one number, and the pairwise
losses that teach it which of two responses people preferred.

    python reward.py --ckpt out/ckpt.pt --prompt "Once upon a time" --response "there was a cat."
    python reward.py --ckpt out/ckpt.pt --pairs pairs.jsonl     # accuracy on prompt/chosen/rejected
    python reward.py --ckpt ../shared/data/llama2c/stories260K/stories260K.bin \
        --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --prompt "Hi" --response "Hello"

The last one has an untrained (random) head: any checkpoint model.py reads can be a backbone
(llama2.c, Meta, Hugging Face, GGUF), and an HF LlamaForSequenceClassification directory brings
its trained `score` head with it.

    rm = RewardModel.from_backbone_checkpoint(path)   # or .from_config(cfg), .load(saved)
    r = rm(tokens, attention_mask)                     # (B,), read at each row's last real token
    r_c, r_r = rm.forward_pair(chosen, chosen_mask, rejected, rejected_mask)  # one backbone call
    loss = pairwise_loss("logsig", r_c, r_r, margin=None, center_coef=0.0)

Pooling. The reward is the head applied to the hidden state of the last real token (the EOS that
data/pairs.py appends), found from the attention mask, never from a pad id: when pad == eos
(LLaMA has no pad token), searching for the pad id finds the EOS itself or a padding token.
With positions derived from the mask in model.py, left, right and no padding give one reward.

beta. pairwise_loss takes no `beta` (ColossalChat's LogSigLoss accepts one and ignores it):
-logsigmoid(beta * (r_c - r_r)) is the beta = 1 loss of a head whose weights are multiplied by
beta, so beta would only rescale the rewards (and the head's effective learning rate), which the
head learns anyway. The beta that matters is DPO's, where the "reward" is
beta * log(pi / pi_ref) and the policy cannot rescale it freely.
"""

import json
import os
import tempfile
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cli import ArgumentParser, UsageError, is_torch_file, load_torch, run
from model import ModelConfig, Transformer

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


def pad_and_concat(a, a_mask, b, b_mask):
    """Stack two (B, Ta) and (B, Tb) batches into one (2B, max(Ta, Tb)) batch: the shorter is
    right-padded with token 0 and mask 0, which changes nothing since we pool by the mask."""
    a_mask = torch.ones_like(a) if a_mask is None else a_mask
    b_mask = torch.ones_like(b) if b_mask is None else b_mask
    T = max(a.size(1), b.size(1))
    pad = lambda x: F.pad(x, (0, T - x.size(1)))  # zeros on the right
    tokens = torch.cat([pad(a), pad(b)])  # (2B, T)
    mask = torch.cat([pad(a_mask.long()), pad(b_mask.long())])  # (2B, T)
    return tokens, mask


def packed_attention_mask(segments):
    """(B, T, T) bool, True where a query may attend to a key, for rows packed by
    data/pairs.pack_pairs; segments (B, T): 0 prompt, 1 chosen, 2 rejected, -1 padding.

               keys:  P P P C C R R .
        queries:  P   x
                  P   x x
                  P   x x x
                  C   x x x x
                  C   x x x x x
                  R   x x x     x            the rejected response sees the prompt and
                  R   x x x     x x          itself, never the chosen response
                  .   x x x         x        padding sees itself: no row is empty (NaN)

    Causal, and a key outside the prompt only for queries of its own segment. Padding comes
    last in a row, so real queries never see it; its outputs are never read."""
    T = segments.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()  # (T, T)
    q, k = segments[:, :, None], segments[:, None, :]  # (B, T, 1), (B, 1, T)
    return causal & ((k == 0) | (k == q))  # (B, T, T)


def packed_block_mask(segments):
    """packed_attention_mask as a FlexAttention BlockMask (for CUDA): blocks that no query may
    see, the upper triangle and rejected x chosen, are skipped instead of computed and masked."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, k):
        return (k <= q) & ((segments[b, k] == 0) | (segments[b, k] == segments[b, q]))

    B, T = segments.shape
    return create_block_mask(mask_mod, B, None, T, T, device=segments.device)


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


def accuracy(r_chosen, r_rejected):
    """Fraction of pairs with r_c > r_r, strictly: a tie is not a correct ranking (a model that
    gives every response 0 would otherwise be 100% accurate)."""
    return (r_chosen > r_rejected).float().mean()


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


# ----------------------------------------------------------------------------- the models
class ScalarHeadModel(nn.Module):
    """A LLaMA backbone with a Linear(dim, 1) `head`: the reward models here and critic.Critic.
    It owns construction, saving and loading; a subclass says where the head reads (forward)."""

    head_bias = True

    def __init__(self, backbone: Transformer):
        super().__init__()
        self.backbone = backbone
        device = backbone.tok_embeddings.weight.device
        self.head = new_head(backbone.config.dim, bias=self.head_bias).to(device)

    @classmethod
    def from_config(cls, cfg: ModelConfig):
        """A freshly initialised model (for tests and training from scratch)."""
        return cls(Transformer(cfg))

    @classmethod
    def from_backbone_checkpoint(cls, path):
        """The backbone from any checkpoint checkpoints.read_checkpoint reads (llama2.c, Meta,
        HF, GGUF); the head is new, unless the file is an HF sequence classifier whose
        `score.weight` comes in the same read: then it is the head's weight."""
        from checkpoints import read_checkpoint

        config, sd = read_checkpoint(path)
        score = sd.pop("score.weight", None)
        model = cls(Transformer.from_state_dict(ModelConfig(**config), sd, path))
        if score is not None:
            if score.shape != model.head.weight.shape:
                raise ValueError(f"{path}: score.weight {tuple(score.shape)} is not (1, dim)")
            with torch.no_grad():  # HF's score has no bias: ours stays 0
                model.head.weight.copy_(score)
        return model.eval()

    def checkpoint_dict(self):
        """What save() writes: {"kind", "config", "model"}; train_rm adds its own keys beside."""
        config = asdict(self.backbone.config)
        return {"kind": type(self).__name__, "config": config, "model": self.state_dict()}

    def save(self, path):
        """Config and weights in one file, readable with weights_only=True. Written to a
        temporary file and renamed, so a crash mid-write never leaves a truncated checkpoint."""
        torch.save(self.checkpoint_dict(), str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)

    @classmethod
    def load(cls, path, map_location="cpu"):
        ckpt = _read_checkpoint(path, map_location)
        if ckpt["kind"] != cls.__name__:
            raise ValueError(f"{path} holds a {ckpt['kind']}, not a {cls.__name__}")
        return cls._adopt(ckpt, path)

    @classmethod
    def _adopt(cls, ckpt, source):
        """Take the saved tensors: the backbone through model.py's checks, then the head."""
        sd = ckpt["model"]
        backbone_sd = {
            k.removeprefix("backbone."): v for k, v in sd.items() if k.startswith("backbone.")
        }
        config = ModelConfig(**ckpt["config"])
        model = cls(Transformer.from_state_dict(config, backbone_sd, source))
        # the head's one or two tensors; older files call it value_head or reward_head
        head_sd = {k.split(".", 1)[1]: v for k, v in sd.items() if not k.startswith("backbone.")}
        model.head.load_state_dict(head_sd)  # strict: a head saved by another class fails loudly
        return model.eval()


def _read_checkpoint(path, map_location="cpu"):
    """The {"kind", "config", "model"} dict of a checkpoint, at its top level or nested under
    "model" (a training checkpoint that also holds an optimizer)."""
    ckpt = torch.load(path, map_location=map_location, mmap=True, weights_only=True)
    if isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict) and "kind" in ckpt["model"]:
        ckpt = ckpt["model"]
    if not isinstance(ckpt, dict) or not {"kind", "config", "model"} <= ckpt.keys():
        found = list(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path}: not a reward checkpoint (need kind/config/model, got {found})")
    return ckpt


def load_reward_model(path, map_location="cpu"):
    """The reward model class the checkpoint's "kind" names, with its weights."""
    ckpt = _read_checkpoint(path, map_location)
    kinds = (RewardModel, LMRegularizedRewardModel, LengthDebiasedRewardModel)
    classes = {c.__name__: c for c in kinds}
    if ckpt["kind"] not in classes:
        raise ValueError(f"{path}: kind {ckpt['kind']!r} is not one of {list(classes)}")
    return classes[ckpt["kind"]]._adopt(ckpt, path)


class RewardModel(ScalarHeadModel):
    def forward(self, tokens, attention_mask=None):
        """Rewards (B,) read at each row's last real token (the last column without a mask).
        Only that token's state is computed in the last layer (hidden_states' `at`)."""
        B, T = tokens.shape
        if attention_mask is None:
            last = torch.full((B,), T - 1, device=tokens.device)
        else:
            last = last_real_index(attention_mask)
        h = self.backbone.hidden_states(tokens, attention_mask, at=last[:, None])  # (B, 1, dim)
        return apply_head(self.head, h[:, 0])  # (B,)

    def forward_pair(self, chosen, chosen_mask, rejected, rejected_mask):
        """(r_chosen, r_rejected), each (B,), from one backbone call on the 2B rows: half the
        kernel launches of two calls, and one set of activations for the backward pass."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        r = self(tokens, mask)  # (2B,)
        return r[: chosen.size(0)], r[chosen.size(0) :]

    def forward_pair_packed(
        self, tokens, segments, positions, chosen_end, rejected_end, flex=False
    ):
        """(r_chosen, r_rejected), each (B,), from rows [prompt | chosen | rejected] packed by
        data/pairs.pack_pairs: the prompt the two responses share runs once, not twice. The
        mask and positions make each token see what it sees in its plain sequence, so the
        rewards equal forward_pair's. flex=True uses FlexAttention (CUDA) for the mask."""
        mask = packed_block_mask(segments) if flex else packed_attention_mask(segments)
        ends = torch.stack([chosen_end, rejected_end], 1)  # (B, 2)
        h = self.backbone.hidden_states(
            tokens, segments >= 0, positions=positions, attn_mask=mask, at=ends
        )  # (B, 2, dim)
        r = apply_head(self.head, h)  # (B, 2)
        return r[:, 0], r[:, 1]


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
        kind="logsig",
        margin=None,
        center_coef=0.0,
    ):
        """(total loss, stats). chosen_response_mask (B, Tc) is 1 on the chosen response's
        tokens (prompt and padding 0). One backbone call scores both halves; the LM head runs
        only where a response token is predicted, LM_CHUNK tokens at a time, so no
        (B, T, vocab) logits exist (at a 49k vocabulary they would be the whole memory)."""
        B = chosen.size(0)
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        h = self.backbone.hidden_states(tokens, mask)  # (2B, T, dim)
        r = score_last_token(self.head, h, mask)  # (2B,)
        r_c, r_r = r[:B], r[B:]
        rm_loss = pairwise_loss(kind, r_c, r_r, margin=margin, center_coef=center_coef)

        # the state at t predicts token t + 1: keep the states whose next token is a response's
        rows, cols = chosen_response_mask[:, 1:].nonzero(as_tuple=True)  # (N,) each
        labels = chosen[rows, cols + 1]  # (N,)
        ce = chunked_cross_entropy(self.backbone.output, h[rows, cols], labels, LM_CHUNK)  # (N,)
        # mean over each response's tokens, then over pairs: every pair weighs the same, as in
        # the pairwise term. A mean over all tokens of the batch would make micro-batches (and
        # DDP ranks) with fewer tokens count more: gradient accumulation would no longer equal
        # one big batch (the bug Hugging Face's Trainer fixed in late 2024).
        n_tokens = torch.bincount(rows, minlength=B).clamp(min=1)  # (B,)
        per_pair = torch.zeros(B, device=ce.device).index_add(0, rows, ce) / n_tokens
        lm_loss = per_pair.mean()

        total = rm_loss + lm_coef * lm_loss
        stats = {
            "r_chosen": r_c.detach(),
            "r_rejected": r_r.detach(),
            "rm_loss": rm_loss.detach(),
            "lm_loss": lm_loss.detach(),
            "accuracy": accuracy(r_c, r_r).detach(),
        }
        return total, stats


def pearson(x, y, eps=1e-8):
    """Pearson correlation of two (N,) tensors, differentiable: ODIN's statistic in a batch."""
    x, y = x - x.mean(), y - y.mean()
    return (x * y).sum() / (x.norm() * y.norm() + eps)


class LengthDebiasedRewardModel(RewardModel):
    """ODIN (Chen et al. 2024, arXiv 2402.07319): a second head, `length_head`, on the same
    last-token state, made to absorb what response length explains. Training sees their sum:

        loss = pairwise_loss(q_c + l_c, q_r + l_r)
               + length_coef * (|rho(q, L)| - rho(l, L) + |w_q . w_l|)

    q = head(h), l = length_head(h), L the response lengths in tokens, rho the Pearson
    correlation over the 2B responses of the batch. The length head is pulled towards length,
    the quality head away from it (either sign), and the two weight vectors apart. Scoring
    (forward, forward_pair, evaluation, export) is RewardModel's: the quality head alone, so a
    longer response is no longer paid for being longer. ODIN weighs the correlation and the
    orthogonality terms separately; one coefficient here. Pearson over a batch is a noisy
    estimate: batches of a few pairs decorrelate little."""

    def __init__(self, backbone: Transformer):
        super().__init__(backbone)
        device = backbone.tok_embeddings.weight.device
        self.length_head = new_head(backbone.config.dim, bias=False).to(device)

    @classmethod
    def _adopt(cls, ckpt, source):
        sd = dict(ckpt["model"])  # the length head aside, the rest as every scalar-head model
        length = {k.split(".", 1)[1]: sd.pop(k) for k in list(sd) if k.startswith("length_head.")}
        model = super()._adopt(dict(ckpt, model=sd), source)
        model.length_head.load_state_dict(length)
        return model

    def loss(
        self,
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_response_mask,
        kind="logsig",
        margin=None,
        center_coef=0.0,
        length_coef=1.0,
    ):
        """(total loss, stats) on the right-padded pair batch (data/pairs.py's Batch): prompts
        are shared, so a rejected response's length is its row's length minus the prompt's."""
        tokens, mask = pad_and_concat(chosen, chosen_mask, rejected, rejected_mask)  # (2B, T)
        last = last_real_index(mask)
        h = self.backbone.hidden_states(tokens, mask, at=last[:, None])[:, 0]  # (2B, dim)
        n_chosen = chosen_response_mask.sum(1)  # (B,)
        n_prompt = chosen_mask.sum(1) - n_chosen
        lengths = torch.cat([n_chosen, rejected_mask.sum(1) - n_prompt])  # (2B,)
        return self._odin(h, lengths, kind, margin, center_coef, length_coef)

    def loss_packed(
        self,
        tokens,
        segments,
        positions,
        chosen_end,
        rejected_end,
        kind="logsig",
        margin=None,
        center_coef=0.0,
        length_coef=1.0,
        flex=False,
    ):
        """loss() on rows [prompt | chosen | rejected] (data/pairs.py's PackedBatch): each
        response's length is the count of its segment's tokens."""
        mask = packed_block_mask(segments) if flex else packed_attention_mask(segments)
        ends = torch.stack([chosen_end, rejected_end], 1)  # (B, 2)
        h = self.backbone.hidden_states(
            tokens, segments >= 0, positions=positions, attn_mask=mask, at=ends
        )  # (B, 2, dim)
        h = h.transpose(0, 1).flatten(0, 1)  # (B, 2, dim) -> (2B, dim): chosen rows, then rejected
        lengths = torch.cat([(segments == 1).sum(1), (segments == 2).sum(1)])  # (2B,)
        return self._odin(h, lengths, kind, margin, center_coef, length_coef)

    def _odin(self, h, lengths, kind, margin, center_coef, length_coef):
        """The loss above from the 2B last-token states (chosen first) and response lengths."""
        B = h.size(0) // 2
        q, l = apply_head(self.head, h), apply_head(self.length_head, h)  # (2B,) each
        r = q + l
        rm_loss = pairwise_loss(kind, r[:B], r[B:], margin=margin, center_coef=center_coef)
        lengths = lengths.to(q.dtype)
        rho_q, rho_l = pearson(q, lengths), pearson(l, lengths)
        ortho = (self.head.weight * self.length_head.weight).sum().abs()
        total = rm_loss + length_coef * (rho_q.abs() - rho_l + ortho)
        stats = {  # r_chosen, r_rejected: the quality head's, what evaluation scores
            "r_chosen": q[:B].detach(),
            "r_rejected": q[B:].detach(),
            "rm_loss": rm_loss.detach(),  # the pairwise loss of the sum q + l
            "rho_quality": rho_q.detach(),
            "rho_length": rho_l.detach(),
            "accuracy": accuracy(q[:B], q[B:]).detach(),
        }
        return total, stats


# ----------------------------------------------------------------------------- tokenizers
def tokenizer_files(tok):
    """{file name: uint8 tensor of its bytes}, the tokenizer as a checkpoint carries it (train_rm
    saves it beside the weights), so scoring needs no tokenizer path that a moved or deleted
    dataset folder would break. SentencePiece: its model proto; llama2.c: its .bin; byte-level
    BPE (from a .gguf or tokenizer.json): an HF tokenizer.json and tokenizer_config.json."""
    from data.bpe import BPETokenizer
    from data.tokenizer import Llama2cTokenizer, SentencePieceTokenizer

    if isinstance(tok, BPETokenizer):
        files = {
            "tokenizer.json": tok.to_json(),
            "tokenizer_config.json": tok.hf_tokenizer_config(),
        }
        files = {k: json.dumps(v, ensure_ascii=False).encode() for k, v in files.items()}
    elif isinstance(tok, SentencePieceTokenizer):
        files = {"tokenizer.model": tok.sp.serialized_model_proto()}
    elif isinstance(tok, Llama2cTokenizer):
        files = {"tokenizer.bin": tok.path.read_bytes()}
    else:
        raise TypeError(f"cannot store a {type(tok).__name__} in a checkpoint")
    return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in files.items()}


def checkpoint_tokenizer(source, missing_ok=False):
    """The tokenizer of a checkpoint: a train_rm.py ckpt.pt (its path or its loaded dict), a
    .gguf (its metadata holds one), or a Hugging Face / Meta directory with tokenizer.model or
    tokenizer.json. A train_rm checkpoint's tokenizer is checked against the fingerprint its
    dataset recorded. None records one: a ValueError, or None if missing_ok."""
    from data.tokenizer import load_tokenizer, tokenizer_fingerprint

    name = "the checkpoint" if isinstance(source, dict) else str(source)
    if not isinstance(source, dict) and (os.path.isdir(name) or name.endswith(".gguf")):
        found = [os.path.join(name, f) for f in ("tokenizer.model", "tokenizer.json")]
        found = [f for f in found if os.path.isfile(f)]
        if name.endswith(".gguf"):  # a GGUF may hold weights only
            from gguf_reader import read_gguf_metadata

            found = [name] if "tokenizer.ggml.tokens" in read_gguf_metadata(name) else []
        if found:
            return load_tokenizer(found[0])
        if missing_ok:
            return None
        raise ValueError(f"{name} holds no tokenizer.model or tokenizer.json: pass --tokenizer")
    ckpt = source
    if not isinstance(source, dict):
        ckpt = torch.load(name, map_location="cpu", mmap=True, weights_only=True)
        ckpt = ckpt if isinstance(ckpt, dict) else {}
    files, meta = ckpt.get("tokenizer_files"), ckpt.get("data_meta") or {}
    if files:  # load_tokenizer reads files: lay them out in a scratch directory
        with tempfile.TemporaryDirectory() as d:
            for fname, data in files.items():
                with open(os.path.join(d, os.path.basename(fname)), "wb") as f:
                    f.write(data.numpy().tobytes())
            tok = load_tokenizer(d if "tokenizer.json" in files else os.path.join(d, *files))
    elif isinstance(ckpt.get("tokenizer"), str) and os.path.exists(ckpt["tokenizer"]):
        tok = load_tokenizer(ckpt["tokenizer"])  # older checkpoints hold only the path
    elif missing_ok:
        return None
    else:
        raise ValueError(
            f"{name} records no tokenizer (not saved by train_rm.py, or before checkpoints "
            f"carried one, and {ckpt.get('tokenizer')!r} is gone): pass --tokenizer"
        )
    want, got = meta.get("tokenizer_fingerprint"), tokenizer_fingerprint(tok)
    if want and got != want:
        raise ValueError(f"{name}: its tokenizer has fingerprint {got}, its data recorded {want}")
    return tok


# ----------------------------------------------------------------------------- command line
def _load_for_cli(path):
    """(model, the checkpoint's dict) for a reward checkpoint, or (a RewardModel around any
    backbone checkpoint model.py can read, None)."""
    if not os.path.exists(path):
        raise UsageError(f"{path} not found")
    try:
        if is_torch_file(path):  # a damaged one too: load_torch says "X is corrupt"
            ckpt = load_torch(path, map_location="cpu", mmap=True)
            ckpt = ckpt if isinstance(ckpt, dict) else {}
            if any(isinstance(d, dict) and "kind" in d for d in (ckpt, ckpt.get("model"))):
                return load_reward_model(path), ckpt  # else e.g. llama2.c's .pt
        model = RewardModel.from_backbone_checkpoint(path)
    except UsageError:
        raise
    except ValueError as e:  # the readers' "wrong format, truncated, shapes do not fit"
        raise UsageError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    print(f"note: {path} is a backbone checkpoint; its head is random unless it had a `score`")
    return model, None


@torch.no_grad()
def main(argv=None):
    p = ArgumentParser(description="Score responses with a reward model.")
    p.add_argument("--ckpt", required=True, help="a saved reward model, or any backbone")
    p.add_argument("--tokenizer", default=None, help="default: the one the ckpt carries")
    p.add_argument("--prompt", default="")
    p.add_argument("--response", default=None)
    p.add_argument("--pairs", default=None, help='JSONL rows {"prompt","chosen","rejected"}')
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--export_hf", default=None, help="write a LlamaForSequenceClassification dir")
    args = p.parse_args(argv)
    if sum(a is not None for a in (args.response, args.pairs, args.export_hf)) != 1:
        p.error("give exactly one of --response, --pairs and --export_hf")
    if args.batch_size < 1:
        p.error(f"--batch_size must be >= 1, got {args.batch_size}")

    from data.chat import chat_format
    from data.pairs import encode_pair, read_pairs  # the tokenization train_rm uses
    from data.tokenizer import load_tokenizer

    model, ckpt = _load_for_cli(args.ckpt)
    meta = (ckpt or {}).get("data_meta") or {}
    try:
        tok = (
            load_tokenizer(args.tokenizer)
            if args.tokenizer
            else checkpoint_tokenizer(ckpt or args.ckpt)
        )
    except ValueError as e:
        p.error(str(e))
    if args.export_hf is not None:
        from export_hf import export_hf

        export_hf(model, args.export_hf, tok, meta)
        return
    fmt = chat_format(tok, meta.get("chat_format", "auto"))  # the layout it was trained on
    max_len = model.backbone.config.max_seq_len
    if args.response is not None:
        pair = {"prompt": args.prompt, "chosen": args.response, "rejected": args.response}
        prompt, response, _, _ = encode_pair(tok, pair, max_len, fmt)
        print(f"reward: {model(torch.tensor([prompt + response])).item():.6f}")
        return
    pairs, _ = read_pairs(args.pairs)  # a bad row: BadRowError naming file:line
    if not pairs:
        raise UsageError(f"{args.pairs} holds no pairs")
    r_c, r_r = [], []
    for i in range(0, len(pairs), args.batch_size):
        chosen, rejected = [], []
        for pair in pairs[i : i + args.batch_size]:
            prompt, c, r, _ = encode_pair(tok, pair, max_len, fmt)
            chosen.append(list(prompt) + c), rejected.append(list(prompt) + r)
        rc, rr = model.forward_pair(*_right_pad(chosen), *_right_pad(rejected))
        r_c.append(rc), r_r.append(rr)
    r_c, r_r = torch.cat(r_c), torch.cat(r_r)
    print(f"{len(pairs)} pairs, accuracy {accuracy(r_c, r_r).item():.4f}")
    print(f"mean reward chosen {r_c.mean().item():.4f}, rejected {r_r.mean().item():.4f}")


def _right_pad(seqs):
    """Lists of ids -> tokens (B, T), mask (B, T)."""
    T = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    return tokens, mask


if __name__ == "__main__":
    run(main)
