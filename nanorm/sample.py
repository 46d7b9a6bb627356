"""
Generate text with a LLaMA checkpoint: by default llama2.c's stories260K, greedy, which prints
the story llama2.c's own test expects.

    python -m nanorm.sample                                   # greedy story from llama2.c's stories260K
    python -m nanorm.sample --prompt "Once upon a time" --temperature 0.8 --top_k 40
    python -m nanorm.sample --ckpt path/to/hf_llama_dir --tokenizer path/to/tokenizer.model
    python -m nanorm.sample --ckpt ../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --tokenizer ../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --prompt "Hi"
    python -m nanorm.sample --ckpt out/ckpt.pt --prompt "1 + 2 ="    # a trained RM's backbone, its tokenizer

One process, on the CPU: generation here is a demonstration, not a service, so there is no
torchrun form. --ckpt takes any checkpoint nanorm/base/checkpoints.py reads (train_rm's ckpt.pt, whose tokenizer it
carries, and every foreign format): its backbone.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the project root is not on the path
    raise SystemExit(f"{__file__} is part of the nanorm library: run python -m nanorm.sample")

import os
from dataclasses import asdict, dataclass

import torch

from data.tokenizer import load_tokenizer
from nanorm.base.checkpoints import load
from nanorm.base.command import NON_NEGATIVE, UsageError, opt, parse_config, run
from nanorm.ckpt import checkpoint_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
STORIES = os.path.join(HERE, "..", "..", "shared", "data", "llama2c", "stories260K")
STORIES_BIN = os.path.join(STORIES, "stories260K.bin")
AT_LEAST_1_OR_NONE = (lambda v: v is None or v >= 1, ">= 1")


@dataclass
class SampleConfig:
    ckpt: str = opt(STORIES_BIN, "llama2.c .bin/.pt, an HF or Meta directory, or a .gguf file")
    tokenizer: str | None = opt(None, ".bin, .model, .gguf or tokenizer.json (default: the ckpt's)")
    prompt: str = opt("", "the text to continue")
    max_new_tokens: int = opt(200, "at most (fewer where the text ends)", NON_NEGATIVE)
    temperature: float = opt(0.0, "0: greedy", NON_NEGATIVE)
    top_k: int | None = opt(None, "sample among the k likeliest only", AT_LEAST_1_OR_NONE)
    seed: int = opt(1337, "seeds the sampling", NON_NEGATIVE)


def main(argv=None):
    args = parse_config(SampleConfig, argv, description="Generate text with a LLaMA checkpoint.")
    if args.tokenizer is None and args.ckpt == STORIES_BIN:
        args.tokenizer = os.path.join(STORIES, "tok512.bin")
    for path in (args.ckpt, args.tokenizer):
        if path is not None and not os.path.exists(path):
            raise UsageError(f"{path} not found")

    torch.manual_seed(args.seed)
    c = load(args.ckpt)  # a truncated, foreign or hostile file: one line naming it
    model = c.backbone
    try:
        tok = load_tokenizer(args.tokenizer) if args.tokenizer else checkpoint_tokenizer(c)
    except (ValueError, RuntimeError) as e:  # sentencepiece raises RuntimeError
        raise UsageError(f"{args.tokenizer or args.ckpt}: no readable tokenizer ({e})") from None
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters; config {asdict(model.config)}")
    ids = torch.tensor([tok.encode(args.prompt, bos=True)])
    out = model.generate(ids, args.max_new_tokens, args.temperature, args.top_k, eos_id=tok.eos_id)
    print(tok.decode(out[0].tolist()))


if __name__ == "__main__":
    run(main)
