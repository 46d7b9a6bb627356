"""
TRL's RewardTrainer on the recipe's HH-RLHF pairs: the same token ids, the same SmolLM2 weights,
the same held-out report, so its eval.json reads beside bench/recipes/hh_smollm2.sh's.

    pip install trl==1.16.0                   # optional: in no requirements file
    python bench/bench_trl_hh.py --data data/hh_rlhf/smollm2-hh-all --minutes 30 --out out/trl-hh
    python bench/bench_trl_hh.py --data data/hh_rlhf/smollm2-hh-all --minutes 30 --train_layers 4 \
        --dtype bfloat16 --out out/trl-hh-top4                 # the recipe's trained weights
    python bench/bench_trl_hh.py --data data/hh_rlhf/smollm2-hh-all --train_layers 4 \
        --dtype bfloat16 --out out/trl-hh-equal        # the recipe's pairs: 1 h 40 min on 2 cores
    python bench/bench_trl_hh.py --data DIR --pairs 16 --max_eval_pairs 16 --threads 1 --out /tmp/t

--data is a dataset data/hh_rlhf/prepare.py wrote (the recipe's command, MAX_TRAIN=100000, gives
data/hh_rlhf/smollm2-hh-all: 6,806 training pairs, 1,699 held out). What happens, in order:
  1. nanoRM reads SmolLM2-135M-Instruct from its GGUF file (--init, dequantized to fp32) and puts
     a seeded head on it, as train_rm.py does; nanorm/export_hf.py's tensors and config turn it
     into a transformers LlamaForSequenceClassification with the same weights. transformers'
     own GGUF loader is not used: it marks the model quantized and Trainer refuses to train it.
  2. Three checks before anything trains, each an error if it fails (their figures go to
     eval.json under "checks"): HF pools the reward at the last token that is not the pad id,
     so the pad id must be a token absent from the data, not SmolLM2's pad == <|im_end|>, the
     token the reward is read at; HF's score on a padded batch equals its head applied to the
     hidden state at <|im_end|>; and HF's reward equals nanoRM's RewardModel's to 1e-4
     (relative, fp32) on two pairs. TRL also drops pairs longer than max_length without a word:
     max_length covers the longest pair and the rows TRL keeps are counted.
  3. RewardTrainer trains on the pairs as TRL's own preprocessing would leave them: chosen_ids
     = prompt + chosen response, rejected_ids = prompt + rejected response, one (2B, T)
     right-padded batch, loss -log sigmoid(r_c - r_r). TRL's defaults otherwise (AdamW with
     betas 0.9/0.999, no weight decay, no warmup, linear decay to 0 over the run, grad clip 1),
     one pass unless --epochs; --pairs N trains a seeded sample of N pairs; --minutes stops at
     the first step past the budget (the schedule was laid out for the whole pass, so a
     stopped run ends with the learning rate barely decayed).
  4. The trained model scores the held-out pairs (--max_eval_pairs: evenly spaced ones, so every
     subset keeps some) and nanorm/report.py writes OUT/eval.json and its plots, as train_rm.py's
     finish() does; one summary line follows.

Deliberately simplified: no checkpoint is written (the report is the product), and TRL's
gradient checkpointing, on by default to save GPU memory, is off unless --grad_ckpt: it reruns
each layer's forward in the backward, work nanoRM's recipe does not do.
"""

import math
import os
import sys
import tempfile
import time
from contextlib import nullcontext

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data.pairs import open_dataset  # noqa: E402
from nanorm.base.command import (  # noqa: E402
    ArgumentParser,  # noqa: E402
    UsageError,
    run,
)

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
GGUF = os.path.join(SHARED, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
INSTALL = "pip install trl==1.16.0"
BF16 = "bfloat16: TRL's bf16 autocast, the weights stay fp32 (training and scoring)"
TRAIN_LAYERS = "0: every weight (TRL's usual); k: only the top k layers, final norm and head"


def parse(argv):
    p = ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--data", required=True, help="a prepared dataset (data/hh_rlhf/prepare.py)")
    p.add_argument("--init", default=GGUF, help="the weights and vocabulary of the data")
    p.add_argument("--out", default="out/trl-hh", help="eval.json and its plots go here")
    p.add_argument("--minutes", type=float, default=None, help="stop training past this wall time")
    p.add_argument("--pairs", type=int, default=None, help="train on a seeded sample of N pairs")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training pairs")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch_size", type=int, default=8, help="pairs per step")
    p.add_argument("--threads", type=int, default=2, help="torch threads on a CPU")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help=BF16)
    p.add_argument("--train_layers", type=int, default=0, help=TRAIN_LAYERS)
    p.add_argument("--grad_ckpt", action="store_true", help="TRL's gradient checkpointing")
    p.add_argument("--max_eval_pairs", type=int, default=None, help="held-out pairs to score")
    args = p.parse_args(argv)
    for name in ("minutes", "pairs", "epochs", "batch_size", "threads", "max_eval_pairs"):
        if (v := getattr(args, name)) is not None and v <= 0:
            raise UsageError(f"--{name} {v}: must be positive")
    return args


# ----------------------------------------------------------------------------- data
def spread(n, k):
    """k indices of n, evenly spaced and sorted: the data's pairs are stored subset after subset,
    so the first k would all be one subset."""
    return np.unique(np.linspace(0, n - 1, min(k, n)).round().astype(np.int64))


def subset_view(data, idx):
    """The PairDataset `data` restricted to the pairs idx, in that order. The offsets point into
    the shared token array, so only they (and the groups) are sliced."""
    view = object.__new__(type(data))
    view.tokens, view.offsets = data.tokens, data.offsets[idx]
    view.groups = None if data.groups is None else data.groups[idx]
    return view


def pair_rows(data, idx):
    """The pairs idx as TRL's pre-tokenized rows: {"chosen_ids": prompt + chosen response,
    "rejected_ids": prompt + rejected response}, the ids as prepared, no tokenizer involved."""
    out = []
    for i in idx:
        p, c, r = (x.tolist() for x in data[int(i)])
        out.append({"chosen_ids": p + c, "rejected_ids": p + r})
    return out


# ----------------------------------------------------------------------------- the two models
def nanorm_and_hf(init, seed, pad_id, bos_id, eos_id):
    """(nanoRM RewardModel, HF LlamaForSequenceClassification) holding the same weights and
    the same seeded head, in fp32. The head is new_head's draw (std 1/(dim+1)) as train_rm.py
    starts from, not HF's init, so both trainers begin at the same rewards."""
    import transformers

    from nanorm.base.checkpoints import load_transformer
    from nanorm.export_hf import hf_config, hf_state_dict
    from reward import RewardModel

    backbone = load_transformer(init)
    torch.manual_seed(seed)
    rm = RewardModel(backbone).eval()
    config = hf_config(backbone.config, pad_id, bos_id, eos_id)
    hf = transformers.LlamaForSequenceClassification(transformers.LlamaConfig.from_dict(config))
    hf.load_state_dict(hf_state_dict(rm), strict=True)  # RoPE rows permuted to HF's order there
    return rm, hf.eval()


def hf_tokenizer(tok, pad_id, tmp):
    """The vocabulary as a transformers tokenizer padding with pad_id. TRL asks for one only to
    read its pad token (which it copies into model.config.pad_token_id); no text is tokenized."""
    from transformers import AutoTokenizer

    from data.bpe import bpe_tokenizer_files

    for name, blob in bpe_tokenizer_files(tok, pad_id).items():
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(blob)
    return AutoTokenizer.from_pretrained(tmp)


def freeze_below(hf, k):
    """Train only the top k layers, the final norm and the score head: train_rm.py's
    --train_layers k (train_top_layers), so the two trainers update the same weights."""
    layers = hf.model.layers
    if not 0 < k <= len(layers):
        raise UsageError(f"--train_layers {k}: the model has {len(layers)} layers")
    hf.requires_grad_(False)
    for module in (*layers[len(layers) - k :], hf.model.norm, hf.score):
        module.requires_grad_(True)


# ----------------------------------------------------------------------------- the checks
def check_score_position(hf, batch, end_id):
    """HF's pooled score on a right-padded batch against its head on the hidden state at each
    row's <|im_end|>, the token nanoRM reads. Returns the largest difference, and how many rows
    HF would have read elsewhere had the pad id been <|im_end|> (SmolLM2's own pad token)."""
    ids, mask = batch["input_ids"].to(hf.device), batch["attention_mask"].to(hf.device)
    ends = mask.sum(1) - 1  # right padding: the last real token
    rows = torch.arange(len(ids), device=hf.device)
    assert (ids[rows, ends] == end_id).all(), "a row does not end at <|im_end|>"
    with torch.no_grad():
        h = hf.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (2B, T, dim)
        want = hf.score(h[rows, ends]).squeeze(-1)
        got = hf(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    diff = (got - want).abs().max().item()
    assert diff <= 1e-5 * max(want.abs().max().item(), 1e-6), (
        f"HF scores another token than <|im_end|> (largest difference {diff:.3g}): "
        f"pad_token_id {hf.config.pad_token_id}"
    )
    # HF's own rule (the rightmost token that is not the pad id) with pad == <|im_end|>
    t = torch.arange(ids.size(1), device=hf.device)
    misread = int(((t * (ids != end_id)).argmax(-1) != ends).sum())
    return {"score_position_max_diff": diff, "rows_misread_if_pad_were_end": misread}


def check_parity(rm, hf, val, idx, collate, pad_id):
    """nanoRM's RewardModel and HF on the same pairs before training, fp32: HF's (2B,) rewards
    against forward_pair's. Relative to the rewards' scale, which starts near 0.04 (new_head)."""
    b = val.collate(idx, pad_id)  # nanoRM pools by mask: its pad id is irrelevant
    batch = collate(pair_rows(val, idx))
    with torch.no_grad():
        ours = torch.cat(rm.forward_pair(b.chosen, b.chosen_mask, b.rejected, b.rejected_mask))
        theirs = hf(**batch).logits.squeeze(-1)
    rel = ((ours - theirs).abs().max() / ours.abs().max()).item()
    assert rel <= 1e-4, f"HF's rewards differ from nanoRM's by {rel:.3g} (relative) before training"
    return {"parity_rel_diff": rel, "parity_rewards": ours.tolist()}


# ----------------------------------------------------------------------------- training, scoring
def pairs_seen(steps, n, batch_size):
    """Training pairs behind `steps` optimizer steps over n pairs, a partial last batch per pass."""
    per_pass = math.ceil(n / batch_size)
    passes, rest = divmod(steps, per_pass)
    return passes * n + min(rest * batch_size, n)


def time_budget(seconds):
    """A TrainerCallback that ends training at the first step finished past `seconds` of wall
    time from the start of train(): the step in flight completes, so the budget is overshot by
    at most one step."""
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if time.perf_counter() - self.t0 >= seconds:
                control.should_training_stop = True

    return TimeBudget()


def score(hf, data, collate, batch_size, ctx):
    """(n, 2) rewards (chosen, rejected) of every pair of `data`, in its order. The pairs go by
    length, longest first, so a batch is padded to little more than its own rows: the speed of
    scoring, not of padding; the order does not change a reward."""
    lengths = np.diff(data.offsets, axis=1)  # (n, 3) prompt, chosen, rejected
    order = np.argsort(-(lengths[:, 0] + lengths[:, 1:].max(1)), kind="stable")
    rewards = torch.empty(len(data), 2)
    with torch.inference_mode(), ctx:
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            batch = {k: v.to(hf.device) for k, v in collate(pair_rows(data, idx)).items()}
            r = hf(**batch).logits.squeeze(-1).float().cpu()  # (2B,): chosen rows, rejected rows
            rewards[torch.as_tensor(idx)] = torch.stack(r.chunk(2), 1)
    return rewards


def main(argv=None):
    args = parse(argv)
    try:  # optional: the benchmark is a comparison, not part of nanoRM
        import trl
        from datasets import Dataset
        from trl import RewardConfig, RewardTrainer
        from trl.trainer.reward_trainer import DataCollatorForPreference
    except ImportError:
        print(f"bench_trl_hh.py needs TRL and transformers: {INSTALL}; nothing run")
        return None
    from data.tokenizer import load_tokenizer, tokenizer_fingerprint
    from nanorm.export_hf import export_pad_id
    from nanorm.report import subsets_of, write_report

    torch.set_num_threads(args.threads)
    d, meta, (train, val) = open_dataset(args.data, "train", "val")
    if not os.path.exists(args.init):
        raise FileNotFoundError(f"{args.init} not found: give SmolLM2's .gguf as --init")
    tok = load_tokenizer(args.init)
    if tokenizer_fingerprint(tok) != meta.get("tokenizer_fingerprint"):
        raise UsageError(f"{d} was tokenized with another vocabulary than {args.init}'s")
    end_id = meta["end_id"]
    # SmolLM2 pads with <|im_end|>, the reward token: HF would then pool one token early.
    # export_hf picks the first special token that is neither end, BOS nor EOS (<|endoftext|>).
    pad_id = export_pad_id(tok, end_id, meta["pad_id"])
    for name, data in (("train", train), ("val", val)):
        if (data.tokens == pad_id).any():
            raise UsageError(f"{d}/{name}.npz holds the pad id {pad_id}: HF would stop there")

    g = torch.Generator().manual_seed(args.seed)
    if args.pairs is not None:  # a sample of every subset, not the first subset's pairs
        train = subset_view(train, torch.randperm(len(train), generator=g)[: args.pairs].numpy())
    if args.max_eval_pairs is not None:
        val = subset_view(val, spread(len(val), args.max_eval_pairs))
    examples = pair_rows(train, range(len(train)))
    max_length = max(len(e[k]) for e in examples for k in e)  # TRL drops what is longer

    rm, hf = nanorm_and_hf(args.init, args.seed, pad_id, meta.get("bos_id"), meta.get("eos_id"))
    collate = DataCollatorForPreference(pad_token_id=pad_id)
    checks = check_parity(rm, hf, val, spread(len(val), 2), collate, pad_id)
    del rm  # 540 MB of fp32 weights the training does not need
    if args.train_layers:
        freeze_below(hf, args.train_layers)

    with tempfile.TemporaryDirectory() as tmp:
        config = RewardConfig(
            output_dir=os.path.join(args.out, "trainer"),
            learning_rate=args.lr,
            per_device_train_batch_size=args.batch_size,
            num_train_epochs=args.epochs,
            max_length=max_length,
            bf16=args.dtype == "bfloat16",  # TRL's default is True: autocast, fp32 weights
            activation_checkpointing=args.grad_ckpt,  # transformers 5's name for it
            use_cpu=not torch.cuda.is_available(),  # else bf16 is refused on a CPU
            dataloader_pin_memory=torch.cuda.is_available(),
            seed=args.seed,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            logging_steps=10,
        )
        trainer = RewardTrainer(
            model=hf,
            args=config,
            train_dataset=Dataset.from_list(examples),
            processing_class=hf_tokenizer(tok, pad_id, tmp),
            callbacks=[time_budget(args.minutes * 60)] if args.minutes else None,
        )
    # TRL sets the model's pad id from the tokenizer's, and filters by max_length silently
    assert hf.config.pad_token_id == pad_id, f"TRL set pad_token_id {hf.config.pad_token_id}"
    assert len(trainer.train_dataset) == len(train), (
        f"TRL kept {len(trainer.train_dataset)} of {len(train)} pairs (max_length {max_length})"
    )
    first = spread(len(val), 4)
    checks |= check_score_position(hf, collate(pair_rows(val, first)), end_id)

    n_train = sum(p.numel() for p in hf.parameters() if p.requires_grad)
    print(
        f"TRL {trl.__version__} RewardTrainer: {len(train):,} pairs x {args.epochs} pass(es), "
        f"batch {args.batch_size}, lr {args.lr:g}, {args.dtype}, {n_train / 1e6:.1f}M of "
        f"{sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M parameters trained, max_length "
        f"{max_length}, pad id {pad_id}, {torch.get_num_threads()} threads on {hf.device}; "
        f"checks: score position diff {checks['score_position_max_diff']:.2g}, "
        f"HF vs nanoRM {checks['parity_rel_diff']:.2g} (relative)"
    )
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    seen = pairs_seen(trainer.state.global_step, len(train), args.batch_size)
    # TRL's count of real (unpadded) tokens, prompt twice per pair: nanoRM's unpacked tokens/s
    tokens = max((e.get("num_tokens", 0) for e in trainer.state.log_history), default=0)

    hf.eval()
    bf16 = args.dtype == "bfloat16"
    ctx = torch.autocast(hf.device.type, torch.bfloat16) if bf16 else nullcontext()
    t0 = time.perf_counter()
    rewards = score(hf, val, collate, args.batch_size, ctx)
    score_s = time.perf_counter() - t0

    info = dict(
        trainer=f"trl {trl.__version__} RewardTrainer",
        pairs_trained=seen,
        steps=trainer.state.global_step,
        tokens_trained=int(float(tokens)),
        train_seconds=train_s,
        score_seconds=score_s,
        pairs_scored=len(val),
        config=vars(args),
        max_length=max_length,
        pad_id=pad_id,
        threads=torch.get_num_threads(),
        checks=checks,
    )
    result = write_report(args.out, subsets_of(val, meta, rewards, os.path.basename(d)), info=info)
    per = ", ".join(f"{k} {m['accuracy']:.3f}" for k, m in result["subsets"].items())
    print(
        f"trl: {seen} pairs trained in {train_s:.0f}s ({train_s / max(seen, 1):.2f} s/pair), "
        f"{len(val)} scored in {score_s:.0f}s ({score_s / len(val):.3f} s/pair); held-out "
        f"accuracy {result['overall']['accuracy']:.4f} ({per}); wrote {args.out}/eval.json"
    )
    return result


if __name__ == "__main__":
    run(main)
