"""bench/bench_trl_hh.py: TRL's RewardTrainer on the recipe's pairs writes the recipe's per-subset
report, having checked that HF reads the reward at <|im_end|> and equals nanoRM before training.
Skipped without trl (pip install trl==1.16.0) or the shared data."""

import gzip
import itertools
import json
import math
import sys

import pytest
from conftest import ROOT, shared_path

sys.path.insert(0, str(ROOT / "bench"))

SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")


@pytest.fixture(scope="module")
def hh_small(tmp_path_factory):
    """The first 25 pairs of each shared HH-RLHF subset, prepared as the recipe prepares all of
    them (SmolLM2's vocabulary and ChatML layout), cut to 160 tokens to keep the test fast."""
    pytest.importorskip("transformers")
    pytest.importorskip("trl")
    hh, gguf = shared_path("hh-rlhf"), shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    from data.hh_rlhf.prepare import main as prepare

    src = tmp_path_factory.mktemp("hh")
    for name in SUBSETS:
        with gzip.open(hh / name / "test.jsonl.gz", "rt") as f:
            head = list(itertools.islice(f, 25))
        (src / name).mkdir()
        (src / name / "test.jsonl").write_text("".join(head))
    out = src / "data"
    prepare(
        ["--src", str(src), "--tokenizer", str(gguf), "--max_len", "160", "--out_dir", f"{out}"]
    )
    return out, gguf


def test_trl_writes_the_recipe_report(hh_small, tmp_path, capsys):
    from bench_trl_hh import main

    data, gguf = hh_small
    out = tmp_path / "trl"
    args = ["--data", str(data), "--init", str(gguf), "--out", str(out), "--pairs", "16"]
    # the top 2 layers: a full fine-tune of 135M parameters would take most of a minute alone
    result = main([*args, "--max_eval_pairs", "16", "--threads", "1", "--train_layers", "2"])

    report = json.loads((out / "eval.json").read_text())
    assert sorted(report["subsets"]) == sorted(SUBSETS)
    assert report["overall"]["n"] == 16 and report["pairs_trained"] == 16
    for m in [*report["subsets"].values(), report["overall"]]:
        assert math.isfinite(m["accuracy"]) and 0 <= m["accuracy"] <= 1
    checks = report["checks"]
    assert checks["score_position_max_diff"] <= 1e-5  # HF pools at <|im_end|>
    # ...and would not have with SmolLM2's own pad token: every row would be read one too early
    assert checks["rows_misread_if_pad_were_end"] == 8
    assert checks["parity_rel_diff"] <= 1e-4 and report["pad_id"] != 2
    assert result == {k: report[k] for k in result}
    assert "trl: 16 pairs trained" in capsys.readouterr().out
