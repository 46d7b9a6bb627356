"""
nanoRM's own checkpoint, ckpt.pt, above the heads: what it holds, writing it atomically,
resuming from it, the tokenizer it carries, and the model class it names. Every file is read by
nanorm/base/checkpoints.py (load), below the heads; this module builds the classes on what it read.

    save_checkpoint(path, rm, meta=meta, optimizer=opt, step=step, train_config=cfg)
    save_checkpoint(path, policy)        # a plain Transformer (kind "Transformer") too
    update_checkpoint(path, length_calibration=cal)   # rewritten atomically
    step = resume(path, rm, optimizer, device, meta)
    rm, ckpt = load_reward_model(path)   # ours, of the class its kind names; else a RewardModel
    rm, ckpt = load_reward_model(c)      # the same from a checkpoints.load(path) already read
    tok = checkpoint_tokenizer(path)     # a ckpt.pt's carried tokenizer, a .gguf's, an HF dir's
    check_tokenizer(init, meta, dataset) # data of another vocabulary than --init's: refused

What ckpt.pt holds: one dict, torch.save'd, read with weights_only=True (tensors and plain data):
    kind, config, model   the class name, ModelConfig as a dict, state dict ("backbone.*" and
                          the heads; a plain Transformer's under "backbone." too)
    tokenizer_files       {file name: uint8 tensor}: the tokenizer itself, so a moved run folder
                          or a deleted dataset never stops a checkpoint from scoring text
    data_meta, tokenizer  the dataset's meta.json (vocabulary, chat layout, subsets) and the
                          tokenizer's path when it was trained
    train_config          train_rm.py's options (nanorm.dpo's, for a DPO policy)
    implicit_reward       kind ImplicitReward (nanorm/dpo.py): {"beta", "scoring"}; its model
                          holds the policy as "backbone.*" and the frozen reference it is
                          measured against as "reference.*", so the file scores on its own
    length_calibration    {"kind": "linear_log_length", "coef": [a, b], "n"}: reward.py, eval_rm.py
                          serve r - (a + b log L), L the response's tokens (calibrate.py)
    reward_normalization  {"mean", "std", "n", "calibrated"} of the served rewards on held-out
                          pairs, for score.py --normalize; both written by update_checkpoint,
                          both dropped by a new save (new weights: refit them)
    trainable             LoRA runs only: the adapters and head (`model` holds them merged)
    optimizer, step, rng, cuda_rng   what --resume needs to continue exactly
    lr_scheduler          the scheduler's state_dict (train_rm's is a function of the step)
Each field is checked where it is read (_check_record for scoring, resume for its own): a damaged
one is one line naming it and the file. A field that nothing reads never refuses the file, so a
ckpt.pt that cannot be resumed still scores.
"""

import math
import os
import reprlib
import sys
import tempfile
from dataclasses import asdict
from functools import lru_cache

import torch

from data.tokenizer import (
    Llama2cTokenizer,
    SentencePieceTokenizer,
    load_tokenizer,
    tokenizer_fingerprint,
)
from model import Transformer
from nanorm.base.checkpoints import Checkpoint, finite, load, plain_file_name
from nanorm.base.command import UsageError, atomic_write
from nanorm.base.runtime import Diverged, all_reduce_sum
from reward import SCORINGS, ImplicitReward, LMRegularizedRewardModel, RewardModel


# ----------------------------------------------------------------------------- writing
def save_checkpoint(
    path,
    rm,
    meta=None,
    optimizer=None,
    step=None,
    train_config=None,
    model_state=None,
    optimizer_state=None,
    lr_scheduler=None,
    world=None,
):
    """Write rm (and what resuming needs, when given) to path, atomically: written aside,
    flushed to disk, then renamed, so a kill at any moment leaves the previous file whole.
    model_state, optimizer_state: the full state dicts to write instead of rm's and optimizer's
    own: a sharded rm's (fsdp.full_state, each rank holds only its shards), or a LoRA rm's with
    the adapters folded in (lora.merged_state_dict: the checkpoint keeps the original keys)."""
    kind = type(rm).__name__.removeprefix("FSDP")  # fsdp.py's fully_shard renames the class
    if isinstance(rm, Transformer):  # a policy: its backbone alone, in the same layout
        ckpt = {"kind": kind, "config": asdict(rm.config)}
        ckpt["model"] = {f"backbone.{k}": v for k, v in rm.state_dict().items()}
    elif isinstance(rm, ImplicitReward):  # DPO's policy ("backbone.*") and its reference
        ckpt = {"kind": kind, "config": asdict(rm.backbone.config), "model": rm.state_dict()}
        ckpt["implicit_reward"] = {"beta": rm.beta, "scoring": rm.scoring}
    else:
        ckpt = {"kind": kind, "config": asdict(rm.backbone.config)}
        ckpt["model"] = rm.state_dict() if model_state is None else model_state
    if (
        model_state is not None and ckpt["model"].keys() != rm.state_dict().keys()
    ):  # LoRA: resuming needs the adapters
        ckpt["trainable"] = {n: p.detach() for n, p in rm.named_parameters() if p.requires_grad}
    if meta is not None:  # the vocabulary, chat layout and subsets the model was trained on
        ckpt.update(tokenizer=meta["tokenizer"], data_meta=meta)
        ckpt["tokenizer_files"] = _carried_tokenizer(
            meta["tokenizer"], meta.get("tokenizer_fingerprint")
        )
    if train_config is not None:
        ckpt["train_config"] = asdict(train_config)
    if optimizer is not None:
        optimizer_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
        ckpt.update(optimizer=optimizer_state, step=step, rng=torch.get_rng_state())
        if lr_scheduler is not None:  # its state_dict: resuming needs only the step
            ckpt["lr_scheduler"] = lr_scheduler
        if world is not None:  # the processes that trained it: the global batch is theirs
            ckpt["world"] = world
        if torch.cuda.is_available():
            ckpt["cuda_rng"] = torch.cuda.get_rng_state_all()
    with atomic_write(path) as f:
        torch.save(ckpt, f)


@lru_cache(maxsize=1)
def _carried_tokenizer(path, fingerprint):
    """The dataset's tokenizer as files, read once per run. None, with a note, if the file is
    gone; an error if it is no longer the vocabulary the data was tokenized with."""
    if not os.path.exists(path):
        print(f"note: {path} is gone; the checkpoint records only the tokenizer's path")
        return None
    tok = load_tokenizer(path)
    if fingerprint and tokenizer_fingerprint(tok) != fingerprint:
        raise ValueError(f"{path} is no longer the vocabulary the data was tokenized with")
    return tokenizer_files(tok)


def tokenizer_files(tok):
    """{file name: uint8 tensor of its bytes}, the tokenizer as a checkpoint carries it.
    SentencePiece: its model proto; llama2.c: its .bin; byte-level BPE (from a .gguf or
    tokenizer.json): an HF tokenizer.json and tokenizer_config.json."""
    if isinstance(tok, SentencePieceTokenizer):
        files = {"tokenizer.model": tok.sp.serialized_model_proto()}
    elif isinstance(tok, Llama2cTokenizer):
        files = {"tokenizer.bin": tok.path.read_bytes()}
    elif hasattr(tok, "merges"):  # byte-level BPE, whose reader loads with its files
        from data.bpe import bpe_tokenizer_files

        files = bpe_tokenizer_files(tok)
    else:
        raise TypeError(f"cannot store a {type(tok).__name__} in a checkpoint")
    return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in files.items()}


# ----------------------------------------------------------------------------- reading
def update_checkpoint(path, **keys):
    """Set (or, for None, remove) top-level keys of a ckpt.pt, rewritten atomically: e.g. the
    length calibration and normalization eval_rm.py --save_calibration measured on it."""
    ckpt = dict(_ours(path, "nothing stored in it").record)  # mapped: the rename keeps it
    for k, v in keys.items():
        if v is None:
            ckpt.pop(k, None)
        else:
            ckpt[k] = v
    with atomic_write(path) as f:
        torch.save(ckpt, f)


def resume(path, rm, optimizer, device, meta, load_full_state=None, same=None):
    """Restore weights, optimizer and RNG from a checkpoint; returns its step. load_full_state:
    how a sharded rm takes its shards of the full state (fsdp.load_full_state), read on the CPU.
    same: {option: value} that must equal the run's stored train_config (what the run is: its
    data, batch, loss, learning rate, seed, model); each difference is named, in one line."""
    ckpt = _ours(path, "it cannot be resumed").record  # on the CPU; loading copies it over
    if not {"optimizer", "rng", "step"} <= ckpt.keys():
        raise UsageError(f"{path} holds no optimizer state: it cannot be resumed")
    _check_record(ckpt, path, ("data_meta", "train_config"))  # what resume reads of them
    _check_resume_fields(ckpt, path, device)  # before anything of the run is changed
    old = ckpt.get("data_meta") or {}
    for key in ("vocab_size", "tokenizer_fingerprint"):
        if old.get(key) is not None and meta.get(key) is not None and old[key] != meta[key]:
            raise UsageError(
                f"{path} was trained with another vocabulary ({key} {old[key]}, the dataset's "
                f"is {meta[key]}): resume with its --dataset, or start afresh with --overwrite"
            )
    stored = dict(ckpt.get("train_config") or {})
    if "batch_size" in stored and "grad_accum" in stored:  # any split of one global batch
        stored["global_batch"] = stored["batch_size"] * stored["grad_accum"] * ckpt.get("world", 1)
    changed = [k for k, v in (same or {}).items() if k in stored and stored[k] != v]
    if changed:

        def name(k, v):
            if k == "global_batch":
                return f"{v} pairs a step (--batch_size x --grad_accum x processes)"
            return f"--{k} {v}"

        was = " ".join(name(k, stored[k]) for k in changed)
        now = " ".join(name(k, same[k]) for k in changed)
        raise UsageError(
            f"--resume: {path} is a run with {was}, this one asks {now}: resume with its "
            "options, or start afresh with --overwrite or another --out_dir"
        )
    try:
        if "trainable" in ckpt:  # LoRA: the frozen base is --init's; adapters and head from here
            missing = {n for n, p in rm.named_parameters() if p.requires_grad} - ckpt[
                "trainable"
            ].keys()
            if missing:
                raise RuntimeError(f"missing {sorted(missing)[:3]}")
            rm.load_state_dict(ckpt["trainable"], strict=False)
        elif load_full_state:  # the optimizer's shards too
            load_full_state(rm, optimizer, ckpt["model"], ckpt["optimizer"])
        else:
            rm.load_state_dict(ckpt["model"])
    except RuntimeError:  # another --model, --init or --lm_coef than the run it continues
        raise UsageError(
            f"{path} does not fit this model: resume with the options it was trained with "
            "(its train_config)"
        ) from None
    if not load_full_state:
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
            for p, state in optimizer.state.items():  # a moment per weight, of its shape
                for k, v in state.items():
                    if isinstance(v, torch.Tensor) and v.dim() and v.shape != p.shape:
                        raise ValueError(f"its {k} is {tuple(v.shape)}, a weight {tuple(p.shape)}")
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise UsageError(
                f"{path}: its optimizer state does not fit this run's optimizer "
                f"({' '.join(str(e).split())[:200]}): {NOT_RESUMED}"
            ) from None
    torch.set_rng_state(ckpt["rng"].cpu())
    if "cuda_rng" in ckpt and device.startswith("cuda"):
        torch.cuda.set_rng_state_all([s.cpu() for s in ckpt["cuda_rng"]])
    return ckpt["step"]


NOT_RESUMED = "it cannot be resumed; start afresh with --overwrite (its weights still score)"


def _shown(value):
    """A field's value as a message shows it: short, a tensor by its dtype and size."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of {value.numel():,} values"
    return reprlib.repr(value)


def _check_resume_fields(ckpt, path, device):
    """What resume reads besides the weights, each of its type, refused by name: the step a
    run continues from (a negative one would resume before its start and drop its log rows),
    the RNG states (CUDA's on a GPU), the optimizer's groups and finite moments (a NaN moment
    makes the first update NaN, and the run would stop naming this file as its last good
    checkpoint)."""

    def bad(key, want):
        return UsageError(
            f"{path}: its {key} is {_shown(ckpt.get(key))}, not {want}: {NOT_RESUMED}"
        )

    step = ckpt["step"]
    if type(step) is not int or step < 0:
        raise bad("step", "a step count (an integer >= 0)")
    world = ckpt.get("world", 1)
    if type(world) is not int or world < 1:
        raise bad("world", "a number of processes (an integer >= 1)")
    rng, want = ckpt["rng"], torch.get_rng_state()
    if not isinstance(rng, torch.Tensor) or rng.dtype != want.dtype or rng.shape != want.shape:
        raise bad("rng", f"torch's RNG state ({want.numel():,} bytes)")
    cuda = ckpt.get("cuda_rng", []) if device.startswith("cuda") else []
    if not isinstance(cuda, (list, tuple)) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda
    ):
        raise bad("cuda_rng", "a list of CUDA RNG states")
    opt = ckpt["optimizer"]
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not (
        isinstance(opt, dict)
        and isinstance(opt.get("state"), dict)
        and isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    ):
        raise bad("optimizer", "an optimizer's state (state, param_groups)")
    for i, state in opt["state"].items():
        for k, v in state.items() if isinstance(state, dict) else ():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not finite(v):
                raise UsageError(
                    f"{path}: its optimizer state is not finite ({k} of weight {i}): the "
                    f"first update would make the weights NaN; {NOT_RESUMED}"
                )
    trainable = ckpt.get("trainable", {})
    if not isinstance(trainable, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) and v.is_floating_point() and finite(v)
        for k, v in trainable.items()
    ):
        raise bad("trainable", "LoRA's finite adapters and head (names -> tensors)")


# ----------------------------------------------------------------------------- the model
# how a ckpt.pt's kind is scored: --length_head's model (length_head.py) as a RewardModel (its
# quality head alone: reward.py's STARTS_WITHOUT says why), a policy's Transformer as a backbone
# (a new head); every other kind as itself
SCORED_AS = {"LengthDebiasedRewardModel": "RewardModel", "Transformer": "RewardModel"}


def _ours(path, what):
    """checkpoints.load(path), refused unless it is our ckpt.pt (what: why it must be)."""
    c = load(path)
    if c.kind is None:
        raise UsageError(
            f"{path} is not a nanoRM checkpoint (a {c.format} file, not train_rm.py's ckpt.pt): "
            f"{what}"
        )
    return c


DAMAGED = "a damaged file: use another checkpoint of the run, or train again"
REFIT = (
    "remove it (update_checkpoint(path, {key}=None) in nanorm/ckpt.py), then refit it with "
    "eval_rm.py --save_calibration"
)
META_INTS = ("vocab_size", "bos_id", "eos_id", "end_id", "pad_id", "max_len")
META_STRS = ("tokenizer", "tokenizer_fingerprint", "chat_format")


SCORING_FIELDS = ("tokenizer", "data_meta", "train_config", "length_calibration")
SCORING_FIELDS += ("reward_normalization",)


def _check_record(record, path, fields=SCORING_FIELDS):
    """The fields of a ckpt.pt (or an HF export's nanorm_reward) that scoring reads, each of
    its type, refused in one line naming it: the dataset's meta.json (vocabulary, chat layout),
    the training options eval_rm.py reads (batch size, dtype, dataset), the length calibration
    and the normalization applied to every served reward (a NaN there is a NaN reward). fields:
    the ones to check, those its reader reads (a field nothing reads never refuses a file). The
    tokenizer files are checked where they are read (_carried), resume's own fields by resume."""
    record = {k: record[k] for k in fields if k in record}

    def fail(key, value, want, fix=DAMAGED):
        raise UsageError(f"{path}: its {key} is {_shown(value)}, not {want}: {fix}")

    def real(x):
        return type(x) in (int, float) and math.isfinite(x)

    def count(x):
        return type(x) is int and x >= 0

    if not isinstance(record.get("tokenizer"), (str, type(None))):
        fail("tokenizer", record["tokenizer"], "a path")
    meta = record.get("data_meta")
    if not isinstance(meta, (dict, type(None))):
        fail("data_meta", meta, "a dataset's meta.json (a dict)")
    for key, value in (meta or {}).items():
        if key in META_INTS and not (value is None or type(value) is int):
            fail(f"data_meta {key}", value, "a token id or count")
        if key in META_STRS and not isinstance(value, (str, type(None))):
            fail(f"data_meta {key}", value, "a string")
    train = record.get("train_config")
    if not isinstance(train, (dict, type(None))):
        fail("train_config", train, "train_rm.py's options (a dict)")
    for key, value in (train or {}).items():
        if key in ("batch_size", "grad_accum") and not (type(value) is int and value >= 1):
            fail(f"train_config {key}", value, "an integer >= 1")
        if key in ("dtype", "dataset") and not isinstance(value, (str, type(None))):
            fail(f"train_config {key}", value, "a string")
    cal = record.get("length_calibration")
    fix = REFIT.format(key="length_calibration")
    if cal is not None:
        from nanorm.calibrate import KIND  # the one calibration this nanoRM applies

        coef = cal.get("coef") if isinstance(cal, dict) else None
        if not isinstance(cal, dict) or cal.get("kind") != KIND or not count(cal.get("n")):
            fail("length_calibration", cal, f"a {KIND} fit", fix)
        if not (isinstance(coef, (list, tuple)) and len(coef) == 2 and all(map(real, coef))):
            fail("length_calibration coef", coef, "two finite numbers", fix)
    norm = record.get("reward_normalization")
    fix = REFIT.format(key="reward_normalization")
    if norm is not None:
        if not isinstance(norm, dict) or type(norm.get("calibrated")) is not bool:
            fail("reward_normalization", norm, "{mean, std, n, calibrated}", fix)
        for key, ok in (("mean", real), ("std", lambda x: real(x) and x >= 0), ("n", count)):
            if not ok(norm.get(key)):
                fail(f"reward_normalization {key}", norm.get(key), "a finite number", fix)


def load_reward_model(source):
    """(model, its ckpt.pt dict) for our checkpoint, of the class its kind names (or scores as:
    SCORED_AS); (a RewardModel, None) for any foreign file, whose head is new unless the file
    has one (an HF classifier's `score`, ColossalChat's value_head); a DPO policy's ckpt.pt
    (kind ImplicitReward) is its implicit reward (_implicit_reward). source: a path, or the
    checkpoints.Checkpoint that load(path) returned (the file is not read again). What
    eval_rm.py, nanorm.score and nanorm.rl read."""
    c = source if isinstance(source, Checkpoint) else load(source)
    kinds = {"RewardModel": RewardModel, "LMRegularizedRewardModel": LMRegularizedRewardModel}
    kind = SCORED_AS.get(c.kind, c.kind or "RewardModel")
    if kind == "ImplicitReward":  # a DPO policy: no head, its reference beside it
        _check_record(c.record, c.path)
        return _implicit_reward(c).eval(), c.record
    if kind == "SubsetExpertsRewardModel":  # --subset_experts' model, read where it is met
        from nanorm.subset_experts import SubsetExpertsRewardModel

        kinds[kind] = SubsetExpertsRewardModel
    if kind not in kinds:
        raise UsageError(f"{c.path}: kind {c.kind!r} is not one of {list(kinds)}")
    _check_record(c.record, c.path)  # what scoring reads besides the weights
    # load() refused weights that are not finite (a diverged run), in any format, one tensor
    # at a time; the heads it did not have are new
    model = kinds[kind](pretrained=c)  # heads that do not fit: one UsageError naming them
    return model.eval(), (c.record if c.kind else None)


def _implicit_reward(c):
    """The ImplicitReward of a ckpt.pt of that kind (a Checkpoint read): the policy is its
    backbone, the reference a Transformer of the same shape from its "reference.*" tensors,
    beta and the scoring from its implicit_reward. A tensor missing, extra or of another shape
    is one line naming the file."""
    spec = c.record.get("implicit_reward")
    ok = isinstance(spec, dict) and spec.get("scoring") in SCORINGS
    beta = spec.get("beta") if ok else None
    if not (type(beta) in (int, float) and math.isfinite(beta) and beta > 0):
        raise UsageError(
            f"{c.path}: its implicit_reward is {_shown(spec)}, not {{beta > 0, scoring in "
            f"{SCORINGS}}}: {DAMAGED}"
        )
    state = {k.removeprefix("reference."): v for k, v in c.heads.items()}
    if len(state) != len(c.heads):  # a tensor that is neither the policy's nor the reference's
        other = sorted(k for k in c.heads if not k.startswith("reference."))
        raise UsageError(f"{c.path}: tensor {other[0]} has no place in an ImplicitReward")
    reference = Transformer(c.backbone.config)
    try:
        reference.load_state_dict(state)
    except RuntimeError as e:
        why = " ".join(str(e).split())[:200]
        raise UsageError(
            f"{c.path}: its reference does not fit its policy ({why}): {DAMAGED}"
        ) from None
    reference.to(c.backbone.tok_embeddings.weight.dtype)
    return ImplicitReward(c.backbone, reference, beta, spec["scoring"])


# ----------------------------------------------------------------------------- the tokenizer
def checkpoint_tokenizer(source, missing_ok=False):
    """The tokenizer of a checkpoint: our ckpt.pt (its path, its dict, or its Checkpoint), a
    .gguf (its metadata holds one), or a Hugging Face / Meta directory with tokenizer.model or
    tokenizer.json. A llama2.c checkpoint carries none. Our checkpoint's tokenizer is checked
    against the fingerprint its dataset recorded. None found: a UsageError, or None if
    missing_ok."""
    c, name = (source, source.path) if isinstance(source, Checkpoint) else (None, str(source))
    if isinstance(source, dict):
        name = "the checkpoint"
    elif c is None and not (os.path.isdir(name) or name.endswith(".gguf")):
        c = load(name)  # a torch file or a llama2.c .bin: whose is it?
    ckpt = source if isinstance(source, dict) else c.record if c is not None and c.kind else None
    if ckpt is not None:
        if missing_ok and not ckpt.get("tokenizer_files"):
            return None
        return _carried(ckpt, name)
    found = []
    if os.path.isdir(name):
        found = [os.path.join(name, f) for f in ("tokenizer.model", "tokenizer.json")]
        found = [f for f in found if os.path.isfile(f)]
    elif name.endswith(".gguf"):  # (a GGUF may hold weights only)
        from nanorm.base.gguf_reader import read_gguf_metadata  # the GGUF format, for its file

        found = [name] if "tokenizer.ggml.tokens" in read_gguf_metadata(name) else []
    if found:
        return load_tokenizer(found[0])
    if missing_ok:
        return None
    raise UsageError(
        f"{name} carries no tokenizer (no tokenizer.model/.json inside): pass --tokenizer"
    )


def _carried(ckpt, name):
    files, meta = ckpt.get("tokenizer_files"), ckpt.get("data_meta") or {}
    if files:  # load_tokenizer reads files: lay them out in a scratch directory
        _check_tokenizer_files(files, name)
        with tempfile.TemporaryDirectory() as d:
            for fname, data in files.items():
                with open(os.path.join(d, fname), "wb") as f:
                    f.write(data.numpy().tobytes())
            try:
                tok = load_tokenizer(d if "tokenizer.json" in files else os.path.join(d, *files))
            except (ValueError, OSError) as e:  # the scratch directory is no name to give
                reason = " ".join(str(e).replace(d + os.sep, "").split()).split("; accepted")[0]
                raise UsageError(
                    f"{name}: its tokenizer_files {sorted(files)} are not a readable tokenizer "
                    f"({reason}): pass --tokenizer"
                ) from None
    else:
        raise UsageError(
            f"{name} carries no tokenizer (saved without its data's meta.json, or its "
            f"tokenizer {ckpt.get('tokenizer')!r} was gone): pass --tokenizer"
        )
    want, got = meta.get("tokenizer_fingerprint"), tokenizer_fingerprint(tok)
    if want and got != want:
        raise UsageError(f"{name}: its tokenizer has fingerprint {got}, its data recorded {want}")
    return tok


def _check_tokenizer_files(files, name):
    """A carried tokenizer is {file name: bytes as a uint8 tensor}: names of files in one
    folder (none may name a folder or leave it: they are written out to be read), and either
    one file or an HF tokenizer.json with its config."""
    fix = "pass --tokenizer"
    if not isinstance(files, dict):
        raise UsageError(f"{name}: its tokenizer_files is a {type(files).__name__}: {fix}")
    for fname, data in files.items():
        if not plain_file_name(fname):
            raise UsageError(
                f"{name}: its tokenizer_files holds {reprlib.repr(fname)}, not a file's name: {fix}"
            )
        if not (isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 1):
            raise UsageError(f"{name}: its tokenizer_files {fname} is not bytes: {fix}")
    if len(files) > 1 and "tokenizer.json" not in files:
        raise UsageError(
            f"{name}: its tokenizer_files {sorted(files)} are no tokenizer nanoRM writes: {fix}"
        )


def check_tokenizer(init, meta, dataset):
    """Refuse data tokenized with another vocabulary than the --init checkpoint's, before a
    model is built on it. A checkpoint that carries a tokenizer (ours, a .gguf, an HF or Meta
    directory with one) is compared by fingerprint: an equal vocab_size is not an equal
    vocabulary. One that carries none (llama2.c, a bare Meta directory) is compared by size:
    its embedding rows against the dataset's vocab_size, refused when they differ; equal, a
    one-line warning, since which vocabulary it is cannot be known."""
    want = meta.get("tokenizer_fingerprint")
    if init == "scratch":
        return
    init = str(init)
    # a file is read once here: a directory's or a .gguf's tokenizer lies beside its weights
    c = None if os.path.isdir(init) or init.endswith(".gguf") else load(init)
    tok = checkpoint_tokenizer(c or init, missing_ok=True)
    if tok is None:  # a ckpt.pt saved without its data's meta, llama2.c, a bare Meta dir
        rows = (c or load(init)).backbone.config.vocab_size
        return _check_vocab_size(init, rows, meta, dataset)
    if want and tokenizer_fingerprint(tok) != want:
        size = meta.get("vocab_size")
        size = f"{size:,}" if type(size) is int else "?"
        raise UsageError(
            f"{init} carries tokenizer {tokenizer_fingerprint(tok)} of {tok.vocab_size:,} "
            f"tokens, but the dataset {dataset} was tokenized with {meta['tokenizer']} ({want}, "
            f"{size} tokens): prepare it again with --tokenizer {init}"
        )


def _check_vocab_size(init, rows, meta, dataset):
    """check_tokenizer for a checkpoint without a vocabulary: the sizes are all there is."""
    size = meta.get("vocab_size")
    if size is None:
        return
    beside = [
        os.path.join(os.path.dirname(os.path.abspath(init)) if os.path.isfile(init) else init, f)
        for f in ("tokenizer.model", "tokenizer.bin", "tok512.bin", "tok4096.bin")
    ]  # llama2.c ships tok512.bin / tok4096.bin beside its stories models
    found = next((f for f in beside if os.path.isfile(f)), None)
    tok = found or "<the tokenizer it was trained with>"
    if rows != size:
        raise UsageError(
            f"{init} carries no vocabulary and has {rows} embedding rows, but the dataset "
            f"{dataset} has vocab_size {size} ({meta.get('tokenizer')}): prepare the data "
            f"with --tokenizer {tok}"
        )
    print(
        f"warning: {init} carries no vocabulary: its {rows} embedding rows equal the dataset's "
        f"vocab_size, but that {meta.get('tokenizer')} is its tokenizer cannot be checked",
        file=sys.stderr,
    )


def save_training_checkpoint(path, rm, optimizer, lr_scheduler, step, proc, meta=None, config=None):
    """A training run's checkpoint (train_rm.py's ckpt.pt and ckpt-<step>.pt): rm, optimizer,
    scheduler and step, written atomically by rank 0. Under FSDP every rank gathers the state;
    with LoRA (config.lora_rank) the adapters are folded into the weights, so the checkpoint has
    the base model's keys. Never non-finite weights: the run stops, and the file keeps the last
    finite ones. A full disk: one line, the previous file kept."""
    local = [getattr(p, "_local_tensor", p).detach() for p in rm.parameters()]
    bad = sum(int(not torch.isfinite(p).all()) for p in local)
    if all_reduce_sum(dict(bad=bad), proc.world, proc.device)["bad"]:
        kept = f"{path} keeps the last finite weights" if os.path.exists(path) else "nothing saved"
        raise Diverged(f"the weights are not finite at step {step}: stopping; {kept}")
    full = {}
    if config is not None and config.fsdp:
        from nanorm.fsdp import full_state  # --fsdp

        full = full_state(rm, optimizer)
    if config is not None and config.lora_rank:
        from nanorm.lora import merged_state_dict  # --lora_rank

        full = dict(model_state=merged_state_dict(rm))
    if not proc.master:
        return
    sched = lr_scheduler.state_dict() if lr_scheduler is not None else None
    try:
        save_checkpoint(
            path, rm, meta, optimizer, step, config, lr_scheduler=sched, world=proc.world, **full
        )
    except OSError as e:  # a full disk: the file written aside is gone, the old one kept
        kept = "the previous one is kept" if os.path.exists(path) else "none was written"
        raise UsageError(
            f"{path}: could not be written at step {step} ({e.strerror}); {kept}: "
            "free space, then --resume"
        ) from None


# the options that make a run what it is: --resume refuses to change them (--max_iters, the
# intervals and the device may change)
RESUME_SAME = tuple(
    "dataset init model max_seq_len dropout loss margin center_coef lm_coef lr min_lr warmup "
    "weight_decay grad_clip seed balance bucket train_layers length_head length_coef "
    "subset_experts gate_coef head_lr lora_rank lora_alpha epochs".split()
)


def resume_run(path, cfg, rm, optimizer, proc, meta, load_full_state=None):
    """train_rm.py --resume: resume() with the options a run may not change (RESUME_SAME, and
    the global batch, which any split over ranks and micro-steps keeps); -> the step."""
    same = {k: getattr(cfg, k) for k in RESUME_SAME}
    same["global_batch"] = cfg.batch_size * cfg.grad_accum * proc.world
    step = resume(path, rm, optimizer, proc.device, meta, load_full_state, same)
    if step > cfg.max_iters:
        raise UsageError(
            f"{path} is at step {step}, past --max_iters {cfg.max_iters}: "
            "raise --max_iters to train further"
        )
    if proc.master:
        print(f"resuming from step {step} of {path}")
    return step
