"""
Score a response with a reward model, or export it for Hugging Face: reward.py's command line.

    python -m nanorm.score --ckpt out/ckpt.pt --prompt "Once upon a time" --response "there was a cat."
    python -m nanorm.score --ckpt out/ckpt.pt --prompt "Hi" --response "Hello" --normalize  # (r-mean)/std
    python -m nanorm.score --ckpt out/ckpt.pt --export_hf out/hf       # a LlamaForSequenceClassification
    python -m nanorm.score --ckpt ../shared/data/llama2c/stories260K/stories260K.bin \
        --tokenizer ../shared/data/llama2c/stories260K/tok512.bin --prompt "Hi" --response "Hello"

The last one has an untrained (random) head: any checkpoint model.py reads can be a backbone
(llama2.c, Meta, Hugging Face, GGUF), and an HF LlamaForSequenceClassification directory brings
its trained `score` head with it. The response is laid out as training laid it out (the chat
format stored with the data), and the printed reward is served as the checkpoint says: minus its
length calibration if one is stored (calibrate.py), normalized with --normalize. Accuracy on a
file of pairs is eval_rm.py's.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the project root is not on the path
    raise SystemExit(f"{__file__} is part of the nanorm library: run python -m nanorm.score")

import math
from dataclasses import dataclass

import torch

from data.chat import chat_format
from data.pairs import encode_pair
from data.tokenizer import load_tokenizer
from nanorm.base.checkpoints import load
from nanorm.base.command import REQUIRED, UsageError, opt, parse_config, run
from nanorm.calibrate import served
from nanorm.ckpt import checkpoint_tokenizer, load_reward_model
from nanorm.export_hf import export_hf


@dataclass
class ScoreConfig:
    ckpt: str = opt(REQUIRED, "a saved reward model, or any backbone")
    tokenizer: str | None = opt(None, "default: the one the ckpt carries")
    prompt: str = opt("", "the prompt the response answers")
    response: str | None = opt(None, "the response to score")
    export_hf: str | None = opt(None, "write a LlamaForSequenceClassification dir instead")
    normalize: bool = opt(False, "(r - mean) / std, as the ckpt stores them")
    pairs: str | None = opt(None, "accuracy on pairs: eval_rm.py's (this says how)")


@torch.no_grad()
def main(argv=None):
    description = "Score a response with a reward model, or export it."
    args = parse_config(ScoreConfig, argv, description=description)
    if args.pairs is not None:
        hint = f"python eval_rm.py --ckpt {args.ckpt} --data {args.pairs} --out DIR"
        raise UsageError(f"accuracy on pairs is eval_rm.py's: {hint}")
    if (args.response is None) == (args.export_hf is None):
        raise UsageError("give exactly one of --response and --export_hf")
    c = load(args.ckpt)  # one read of the file: the model, its record and its tokenizer
    model, _ = load_reward_model(c)
    if c.head == "random":
        print(f"note: {args.ckpt} holds no reward head: its head is random")
    ckpt = c.record  # a ckpt.pt's dict, an HF export's calibration record, or {}
    meta = ckpt.get("data_meta") or {}
    tok_file = args.tokenizer  # default: the checkpoint's own
    tok = load_tokenizer(tok_file) if tok_file else checkpoint_tokenizer(c)
    vocab = model.backbone.config.vocab_size
    if tok.vocab_size > vocab:
        raise UsageError(
            f"--tokenizer {tok_file} has {tok.vocab_size} tokens, more than the {vocab} rows of "
            f"{args.ckpt}'s embeddings: use the tokenizer the model was trained with"
        )
    if args.export_hf is not None:  # records the calibration and normalization in config.json
        try:
            export_hf(model, args.export_hf, tok, meta, record=ckpt)
        except ValueError as e:  # a head HF's score cannot hold (a bias, a gated mixture)
            raise UsageError(str(e)) from None
        return
    fmt = chat_format(tok, meta.get("chat_format", "auto"))  # the layout it was trained on
    pair = {"prompt": args.prompt, "chosen": args.response, "rejected": args.response}
    prompt, response, _, _ = encode_pair(tok, pair, model.backbone.config.max_seq_len, fmt)
    r = model(torch.tensor([prompt + response])).item()
    if not math.isfinite(r):  # finite weights can still overflow
        raise UsageError(f"{args.ckpt} gives a reward that is not finite ({r}): not a usable model")
    try:  # the stored length calibration, L = the response's tokens (its end token included)
        r_served = float(served(ckpt, r, len(response), args.normalize, args.ckpt))
    except ValueError as e:
        raise UsageError(f"--normalize: {e}") from None
    what = "normalized" if args.normalize else "length-calibrated"
    served_as = f" ({what}; raw {r:.6f}, {len(response)} response tokens)" if r_served != r else ""
    print(f"reward: {r_served:.6f}{served_as}")


if __name__ == "__main__":
    run(main)
