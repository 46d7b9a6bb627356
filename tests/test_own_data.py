"""README's "Train on your own data": the four commands (prepare, train, evaluate, export) run
as a user runs them, from the repository root, on a small file of conversations in both of TRL's
formats (system messages, several turns) with one bad row. Without shared data: a vocabulary
trained by data/prepare.py and a model from scratch. With it: SmolLM2-135M-Instruct's own
vocabulary, its ChatML layout and its weights (--init, the top layer trained)."""

import json
import os

import pytest
from conftest import SHARED
from launcher import python

TOPICS = ["tea", "rain", "chess", "bikes", "maps", "bread", "stars", "rivers"]
# 10 rows in each format, each its own subset ("source": implicit / explicit), 2 of each held
# out: SmolLM2 reads every pair at up to 128 tokens, so the run's time grows with their number
N_GOOD = 20
BAD_LINE = N_GOOD + 1  # its prompt differs between chosen and rejected


def messages(*turns):
    return [{"role": role, "content": text} for role, text in turns]


def write_conversations(path):
    """Rows in TRL's two conversational formats, a "source" field naming each one's format, and
    a last row whose earlier user turns differ (a pair about two prompts)."""
    rows = []
    for i in range(N_GOOD):
        t = TOPICS[i % len(TOPICS)]
        prompt = [
            ("system", "You are a careful assistant."),
            ("user", f"Tell me about {t}."),
            ("assistant", f"{t.title()} is a fine topic."),
            ("user", f"Why do people like {t} ({i})?"),
        ]
        good = f"People like {t} because it is calm, useful and good to share."
        bad = "No idea." if i % 4 else f"Nobody likes {t}, and nobody ever did, in any country."
        if i % 2 == 0:  # implicit prompt: the shared leading messages
            c, r = messages(*prompt, ("assistant", good)), messages(*prompt, ("assistant", bad))
            rows.append({"chosen": c, "rejected": r, "source": "implicit"})
        else:  # explicit prompt
            c, r = messages(("assistant", good)), messages(("assistant", bad))
            rows.append({"prompt": messages(*prompt), "chosen": c, "rejected": r})
            rows[-1]["source"] = "explicit"
    c = messages(("user", "Hi"), ("assistant", "Hello!"))
    r = messages(("user", "Go"), ("assistant", "Gone."))
    rows.append({"chosen": c, "rejected": r, "source": "implicit"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def sh(*args):
    """One command line, run from the repository root as the README shows it."""
    p = python(args)
    assert p.returncode == 0, f"{' '.join(map(str, args))} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def run_the_four_commands(tmp_path, prepare_args, train_args):
    src, data, out = tmp_path / "prefs.jsonl", tmp_path / "mine", tmp_path / "out"
    write_conversations(src)
    said = sh("data/prepare.py", "--src", src, "--out_dir", data, *prepare_args)
    half = N_GOOD // 2
    assert f"{src}: {N_GOOD} rows, format {half} conversational (implicit prompt), " in said
    assert f"{half} conversational (explicit prompt); bad rows: 1" in said
    assert f"skipping {src}:{BAD_LINE}: prompt differs: " in said
    meta = json.loads((data / "meta.json").read_text())
    assert meta["groups"] == ["implicit", "explicit"] and meta["skipped"] == {"prompt differs": 1}
    assert meta["subsets"]["implicit"]["n_val"] == 2 and meta["subsets"]["explicit"]["n_val"] == 2

    sh("train_rm.py", "--dataset", data, "--out_dir", out, *train_args)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    final = [r for r in log if r["split"] == "eval"][-1]
    assert 0 <= final["acc"] <= 1

    sh("eval_rm.py", "--ckpt", out / "ckpt.pt", "--data", data, "--out", out / "eval")
    report = json.loads((out / "eval" / "eval.json").read_text())
    for name in ("implicit", "explicit"):
        m = report["subsets"][name]
        assert m["n"] == 2 and 0 <= m["accuracy"] <= 1
        assert m["longer_wins"] == pytest.approx(meta["subsets"][name]["longer_wins_val"], abs=1e-4)
    assert report["overall"]["accuracy"] == pytest.approx(final["acc"])  # the same rewards

    sh("-m", "nanorm.score", "--ckpt", out / "ckpt.pt", "--export_hf", out / "hf")
    config = json.loads((out / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert config["num_labels"] == 1
    return meta


@pytest.mark.slow
def test_own_data_from_scratch(tmp_path):
    """No shared data: prepare trains a 400-piece vocabulary (plain-text layout), train_rm a
    0.2M-parameter model for 3 steps."""
    meta = run_the_four_commands(
        tmp_path,
        ["--max_len", "128", "--vocab_size", "400", "--subset_key", "source"],
        ["--max_iters", "3", "--batch_size", "4", "--lm_coef", "0", "--eval_interval", "100"],
    )
    assert meta["chat_format"] == "plain" and meta["vocab_size"] == 400


@pytest.mark.slow
def test_a_bad_row_stops_strict_prepare_naming_file_and_line(tmp_path):
    src = tmp_path / "prefs.jsonl"
    write_conversations(src)
    cmd = ["data/prepare.py", "--src", src, "--out_dir", tmp_path / "mine", "--strict"]
    p = python(cmd)
    assert p.returncode == 2 and not (tmp_path / "mine").exists()
    assert p.stderr.startswith(f"prepare.py: error: {src}:{BAD_LINE}: prompt differs: chosen")
    assert p.stderr.count("\n") == 1  # one line


@pytest.mark.slow
def test_own_data_on_smollm2(tmp_path):
    """SmolLM2-135M-Instruct: its BPE vocabulary and ChatML layout, its weights, the top layer
    trained for 2 steps (about a minute on a 2-core CPU)."""
    gguf = SHARED / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.exists():
        pytest.skip(f"{gguf} absent: this test needs the shared data in ../shared/data")
    meta = run_the_four_commands(
        tmp_path,
        ["--tokenizer", gguf, "--max_len", "128", "--subset_key", "source"],
        ["--init", gguf, "--train_layers", "1", "--lm_coef", "0", "--max_iters", "2"]
        + ["--batch_size", "2", "--eval_first", "false", "--eval_interval", "100"],
    )
    assert meta["chat_format"] == "chatml" and meta["end_id"] != meta["bos_id"]
    os.remove(tmp_path / "out" / "hf" / "model.safetensors")  # 0.5 GB of fp32 weights
