"""bench/best_of_n.py: answers sampled from SmolLM2 for GSM8K questions, each scored by a proxy
reward model and by the verifier; the stored file notebook 06 reads."""

import json
import math
import os
import sys

import pytest
import torch
from conftest import ROOT, shared_path

from nanorm.ckpt import load_reward_model, save_checkpoint
from reward import RewardModel

sys.path.insert(0, os.path.join(ROOT, "bench"))
import best_of_n  # noqa: E402


@pytest.mark.slow
def test_best_of_n_scores_every_answer_as_alone(tmp_path):
    gguf = str(shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    gsm8k = str(shared_path("gsm8k", "test.jsonl"))
    torch.manual_seed(0)
    rm = RewardModel(pretrained=gguf)  # a random head: scores to compare, not to trust
    meta = dict(tokenizer=gguf, vocab_size=49152, pad_id=2, chat_format="chatml")
    save_checkpoint(tmp_path / "ckpt.pt", rm, meta)
    out = tmp_path / "bon.json"
    argv = ["--proxy", str(tmp_path / "ckpt.pt"), "--gsm8k", gsm8k, "--questions", "2"]
    best_of_n.main(argv + ["--k", "3", "--max_new_tokens", "12", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["info"]["k"] == 3 and len(res["questions"]) == 2
    q = res["questions"][0]
    assert len(q["gold"]) == len(q["proxy"]) == len(q["tokens"]) == 3
    assert all(g in (0.0, 1.0) for g in q["gold"]) and all(map(math.isfinite, q["proxy"]))
    assert all(n <= 13 for n in q["tokens"])  # 12 sampled + the end token where cut
    # the padded batch gives each answer the reward it gets alone (the padding never read)
    proxy, _ = load_reward_model(str(tmp_path / "ckpt.pt"))
    prompt, answers = [1, 5, 9], [[7, 8, 2], [7, 2], [3, 4, 5, 6, 2]]
    batched = best_of_n.proxy_rewards(proxy, prompt, answers, 2, best_of_n.nullcontext())
    for a, r in zip(answers, batched, strict=True):
        alone = proxy(torch.tensor([prompt + a])).item()
        assert abs(alone - r) <= 1e-4 * max(1.0, abs(alone)), (alone, r)
