"""eval_rm.py: train_rm's accuracy to the last digit, rewards independent of batch and padding,
metrics against hand computations and prepare.py, RewardBench sections, HF's classifier, the
GSM8K view, and one clear line for bad input."""

import gzip
import json
import math
import os

import numpy as np
import pytest
import torch
from conftest import pad, shared_path, tiny_model

import eval_rm
import nanorm.calibrate as calibrate
import nanorm.report as report
import train_rm
from data import sources
from data.arith.prepare import main as prepare_arith
from data.pairs import PairDataset, write_pairs
from nanorm.base.command import run as run_cli
from reward import RewardModel
from verifiable import gsm8k_reward


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "2000", "--n_val", "300"])
    return str(d)


@pytest.fixture(scope="module")
def trained(arith, tmp_path_factory):
    """A run of a few steps: (its out_dir, its log rows)."""
    out = str(tmp_path_factory.mktemp("run"))
    train_rm.main(
        [
            "--dtype",  # eval_rm.py scores in fp32: the same rewards to the last digit
            "float32",
            "--dataset",
            arith,
            "--out_dir",
            out,
            "--max_iters",
            "8",
            "--eval_interval",
            "8",
            "--eval_pairs",
            "300",
            "--batch_size",
            "16",
        ]
    )
    with open(os.path.join(out, "log.jsonl")) as f:
        return out, [json.loads(r) for r in f]


def evaluate_cli(*argv):
    return eval_rm.main([str(a) for a in argv])


def test_same_accuracy_as_train_rm_to_the_last_digit(arith, trained, tmp_path):
    out, rows = trained
    logged = [r for r in rows if r["split"] == "eval"][-1]["acc"]
    res = evaluate_cli("--ckpt", f"{out}/ckpt.pt", "--data", arith, "--out", tmp_path)
    assert res["overall"]["n"] == 300
    assert res["overall"]["accuracy"] == logged  # ==, not approx
    # train_rm's own report of its final evaluation is the same report, number for number
    with open(os.path.join(out, "eval.json")) as f:
        theirs = json.load(f)
    assert theirs["subsets"].keys() == res["subsets"].keys() == {os.path.basename(arith)}
    assert theirs["overall"] == res["overall"]
    for f in ("reward_hist.png", "reward_length.png", "reliability.png", "curves.png"):
        assert os.path.getsize(os.path.join(out, f)) > 0
        assert f == "curves.png" or os.path.getsize(tmp_path / f) > 0


def test_rewards_do_not_depend_on_batch_size_or_padding_side(tmp_path):
    torch.manual_seed(0)
    rm = tiny_model(RewardModel)
    items = []
    for _ in range(13):  # prompts and responses of many lengths: every batch is padded
        p, c, r = (torch.randint(3, 61, (int(torch.randint(1, 12, ())),)).tolist() for _ in "pcr")
        items.append((p, c + [2], r + [2]))
    write_pairs(tmp_path / "v.npz", items, 61)
    source = sources.Source(PairDataset(tmp_path / "v.npz"), ["x"] * 13, pad_id=0)
    one = eval_rm.score(rm, source, batch_size=1)["x"].rewards
    seven = eval_rm.score(rm, source, batch_size=7)["x"].rewards
    assert (one - seven).abs().max().item() < 1e-5
    for j in (1, 2):  # chosen, rejected: left-padded rows, straight through the model
        tokens, mask = pad([p + resp[j - 1] for p, *resp in items], side="left", pad_id=0)
        with torch.no_grad():
            left = rm(tokens, mask)
        assert (left - one[:, j - 1]).abs().max().item() < 1e-5
    lengths = eval_rm.score(rm, source, 4)["x"].lengths
    assert lengths.tolist() == [[len(c), len(r)] for _, c, r in items]


def test_pair_metrics_against_hand_computations():
    r_c = torch.tensor([2.0, 0.0, 1.0, 1.0, 5.0])
    r_r = torch.tensor([1.0, 0.0, 3.0, 1.0, -1.0])
    len_c = torch.tensor([4, 2, 2, 7, 3])
    len_r = torch.tensor([3, 2, 5, 1, 3])
    m = report.pair_metrics(r_c, r_r, len_c, len_r)
    assert m["n"] == 5 and m["ties"] == 2
    assert m["accuracy"] == 2 / 5  # a tie is not a win
    # chosen longer in pairs 0 and 3, shorter in 2, ties (each half) in 1 and 4
    assert m["longer_wins"] == pytest.approx((2 + 1) / 5) and m["shorter_wins"] == pytest.approx(
        2 / 5
    )
    assert m["longer_wins"] + m["shorter_wins"] == 1
    assert m["mean_margin"] == pytest.approx(1.0) and m["mean_chosen"] == pytest.approx(1.8)
    x, y = torch.cat([r_c, r_r]).numpy(), torch.cat([len_c, len_r]).numpy()
    assert m["length_corr"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert report.correlation(torch.ones(4), torch.arange(4)) is None  # constant: undefined
    # length-balanced: chosen longer in 0 (right) and 3 (a reward tie: wrong), shorter in 2
    # (wrong); the equal lengths of 1 and 4 belong to neither group
    assert m["acc_chosen_longer"] == 0.5 and m["acc_chosen_shorter"] == 0.0
    assert m["length_balanced_accuracy"] == 0.25 and m["length_ties"] == 2
    # "the longer wins" as a reward scores 1 and 0: balanced 0.5, though it is right 3 times in 4
    m = report.pair_metrics(
        len_c[[0, 2, 3, 3]] * 1.0,
        len_r[[0, 2, 3, 3]] * 1.0,
        *(t[[0, 2, 3, 3]] for t in (len_c, len_r)),
    )
    assert m["accuracy"] == 0.75 and m["length_balanced_accuracy"] == 0.5
    # no pair whose chosen is shorter: undefined, not a number made up
    m = report.pair_metrics(r_c[:2], r_r[:2], len_c[:2], len_r[:2])
    assert m["acc_chosen_shorter"] is None and m["length_balanced_accuracy"] is None
    assert "len_bal" in report.table({"subsets": {"x": m}, "overall": m})


def test_ece_known_cases():
    d = math.log(3)  # sigmoid(d) = 0.75
    # always 75% sure and always right: counted in both orders, 0.75 vs 1 and 0.25 vs 0
    ece, _ = calibrate.reliability(torch.full((8,), d), torch.zeros(8))
    assert ece == pytest.approx(0.25)
    # 75% sure, right 3 times in 4: calibrated
    r_c = torch.tensor([d, d, d, -d], dtype=torch.float64)  # float32 would round log 3 by 4e-9
    ece, table = calibrate.reliability(r_c, torch.zeros(4, dtype=torch.float64))
    assert ece == pytest.approx(0.0, abs=1e-12)
    assert [(round(c, 6), f, n) for c, f, n in table] == [(0.25, 0.25, 4), (0.75, 0.75, 4)]
    ece, _ = calibrate.reliability(torch.zeros(5), torch.zeros(5))  # all ties: p = 0.5, half
    assert ece == pytest.approx(0.0)


def test_sections_weighted_as_rewardbench():
    sub = lambda n, acc: {"n": n, "accuracy": acc}
    subsets = {
        "alpacaeval-easy": sub(100, 1.0),
        "mt-bench-easy": sub(28, 0.0),
        "math-prm": sub(447, 1.0),  # weighs as the two code subsets together: 328
        "hep-python": sub(164, 0.5),
        "hep-go": sub(164, 0.5),
        "my-own": sub(10, 0.0),  # in no section
    }
    s = report.section_scores(subsets)
    assert s.keys() == {"Chat", "Reasoning", "score"}
    assert s["Chat"] == pytest.approx(100 / 128)
    assert s["Reasoning"] == pytest.approx((328 * 1.0 + 164 * 0.5 + 164 * 0.5) / 656)
    assert s["score"] == pytest.approx((100 / 128 + 0.75) / 2)
    assert report.section_scores({"my-own": sub(3, 1.0)}) == {}


def write_jsonl(path, rows, gz=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with (gzip.open if gz else open)(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def test_rewardbench_and_hh_files(trained, tmp_path):
    out, _ = trained
    rb = write_jsonl(
        tmp_path / "rb.jsonl",
        [
            {
                "prompt": "What is 2 + 3?",
                "chosen": "The answer is 5.",
                "rejected": "The answer is 6.",
                "subset": "math-prm",
            },
            {
                "prompt": "What is 4 - 1?",
                "chosen": "#### 3",
                "rejected": "#### 5",
                "subset": "hep-go",
            },
            {
                "prompt": "Compute 1 + 1.",
                "chosen": "The answer is 2.",
                "rejected": "The answer is 3.",
                "subset": "math-prm",
            },
            {
                "prompt": "Hi",
                "chosen": "Hello there",
                "rejected": "Go",
                "subset": "alpacaeval-easy",
            },
        ],
    )
    hh = write_jsonl(
        tmp_path / "helpful-base" / "test.jsonl.gz",
        [
            {
                "chosen": "\n\nHuman: 2 + 2?\n\nAssistant: 4",
                "rejected": "\n\nHuman: 2 + 2?\n\nAssistant: 5",
            },
            {
                "chosen": "\n\nHuman: hi\n\nAssistant: hello, how are you",
                "rejected": "\n\nHuman: hi\n\nAssistant: no",
            },
        ],
        gz=True,
    )
    res = evaluate_cli("--ckpt", f"{out}/ckpt.pt", "--data", rb, hh, "--out", tmp_path / "ev")
    assert list(res["subsets"]) == ["math-prm", "hep-go", "alpacaeval-easy", "helpful-base"]
    assert [res["subsets"][k]["n"] for k in res["subsets"]] == [2, 1, 1, 2]
    assert res["overall"]["n"] == 6 and res["head"] == "trained"
    assert res["sections"].keys() == {"Chat", "Reasoning", "score"}
    with open(tmp_path / "ev" / "eval.json") as f:
        assert json.load(f)["sections"] == res["sections"]
    assert res["subsets"]["helpful-base"]["longer_wins"] == 0.75  # 4 vs 5: a tie; then longer


def test_hh_shared_file_named_by_its_folder(trained, tmp_path):
    out, _ = trained
    src = shared_path("hh-rlhf", "harmless-base", "test.jsonl.gz")
    res = evaluate_cli(
        "--ckpt", f"{out}/ckpt.pt", "--data", src, "--max_pairs", 12, "--out", tmp_path
    )
    assert list(res["subsets"]) == ["harmless-base"] and res["overall"]["n"] == 12


def test_gsm8k_pairs_are_labelled_by_the_verifier(tmp_path):
    path = write_jsonl(
        tmp_path / "g.jsonl",
        [
            {
                "question": "Tom has 3 apples and buys 4. How many?",
                "answer": "He has 3+4=<<3+4=7>>7 apples.\n#### 7",
            },
            {"question": "How much is 1,000 + 125?", "answer": "1000+125=1125\n#### 1,125"},
            {
                "question": "Half of 10?",
                "answer": "#### 5",  # sampled solutions, 2 right of 3
                "solutions": ["10/2 = 5\n#### 5", "The answer is 5.", "#### 4"],
            },
            {"question": "Double 2?", "answer": "#### 4", "solutions": ["#### 4"]},  # no wrong one
        ],
    )
    pairs, candidates, left_out = sources.gsm8k_pairs(path)
    assert left_out == 1 and len(candidates) == 3
    assert len(pairs) == 3 + 3 + 2  # 1 right x 3 wrong, twice; 2 right x 1 wrong
    answers = ["7"] * 3 + ["1,125"] * 3 + ["5"] * 2
    for pair, ans in zip(pairs, answers, strict=True):
        assert gsm8k_reward(pair["chosen"], ans) == 1.0 and gsm8k_reward(pair["rejected"], ans) == 0
        assert "<<" not in pair["chosen"]
    assert pairs[0]["rejected"].endswith("#### 8") and pairs[3]["chosen"].endswith("#### 1,125")
    assert [len(c) for c in candidates] == [4, 4, 3]
    # rewards: question 1's right answer scores highest, question 2's does not, question 3's
    # two right solutions rank first and last
    rewards = torch.tensor([[3.0, 1], [3, 0], [3, 2], [0, 1], [0, 0.5], [0, -1], [2, 1], [0, 1]])
    bon = report.best_of_n(rewards, candidates)
    assert bon["best_of_n"] == pytest.approx(2 / 3)
    assert bon["best_of_n_chance"] == pytest.approx((1 / 4 + 1 / 4 + 2 / 3) / 3)
    assert bon["n_prompts"] == 3


def test_gsm8k_view_on_the_shared_test_set(trained, tmp_path):
    out, _ = trained
    src = shared_path("gsm8k", "test.jsonl")
    res = evaluate_cli(
        "--ckpt", f"{out}/ckpt.pt", "--data", f"gsm8k:{src}", "--max_pairs", 6, "--out", tmp_path
    )
    g = res["subsets"]["gsm8k"]
    assert g["n"] == 6 * len(sources.GSM8K_WRONG) and g["n_prompts"] == 6
    assert g["best_of_n_chance"] == pytest.approx(1 / (1 + len(sources.GSM8K_WRONG)))


def test_hf_classifier_directory_scores_as_hf(arith, tmp_path):
    transformers = pytest.importorskip("transformers", reason="the HF parity test needs it")
    pytest.importorskip("safetensors", reason="the HF parity test needs safetensors")
    with open(os.path.join(arith, "meta.json")) as f:
        vocab = json.load(f)["vocab_size"]
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab + 8,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=vocab + 7,
    )  # never in the text
    torch.manual_seed(0)
    hf = transformers.LlamaForSequenceClassification(cfg).eval()
    hf.score.weight.data.normal_()
    hf.save_pretrained(tmp_path / "hf")
    rm, info = eval_rm.load_model(str(tmp_path / "hf"))
    assert info["head"] == "score"
    data = PairDataset(os.path.join(arith, "val.npz"))
    source = sources.Source(data, ["arith"] * 20, pad_id=0)
    ours = eval_rm.score(rm, source, 8)["arith"].rewards
    with torch.no_grad():
        for i in range(20):
            p, c, r = data[i]
            for j, resp in enumerate((c, r)):
                ids = torch.from_numpy(np.concatenate([p, resp]))[None]
                assert abs(hf(input_ids=ids).logits.item() - ours[i, j].item()) < 1e-5
    res = evaluate_cli(
        "--ckpt", tmp_path / "hf", "--data", arith, "--max_pairs", 20, "--out", tmp_path / "ev"
    )
    assert res["head"] == "score" and res["overall"]["n"] == 20


def test_backbone_checkpoint_says_its_head_is_random(tmp_path, capsys):
    ckpt = shared_path("llama2c", "stories260K", "stories260K.bin")
    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    rows = [{"prompt": "Once upon a time", "chosen": "there was a cat.", "rejected": "the end"}]
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    res = evaluate_cli("--ckpt", ckpt, "--tokenizer", tok, "--data", data, "--out", tmp_path)
    assert res["head"] == "random" and list(res["subsets"]) == ["p"]
    assert "the head is random" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing data", "unknown kind", "missing ckpt", "bad rows"])
def test_bad_input_is_one_clear_line(trained, tmp_path, capsys, case):
    out, _ = trained
    ckpt, data = f"{out}/ckpt.pt", str(tmp_path / "x.jsonl")
    if case == "missing data":
        data = str(tmp_path / "nope" / "test.jsonl.gz")
    elif case == "unknown kind":
        data = str(tmp_path / "x.csv")
        open(data, "w").write("a,b\n")
    elif case == "missing ckpt":
        ckpt = str(tmp_path / "nope.pt")
        open(data, "w").write('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    else:
        open(data, "w").write('{"text": "no pair here"}\n')
    with pytest.raises(SystemExit) as e:  # as the command line runs it: run
        run_cli(eval_rm.main, [str(a) for a in ("--ckpt", ckpt, "--data", data, "--out",
                                                tmp_path / "ev")])  # fmt: skip
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in err and (data if case != "missing ckpt" else ckpt) in err
    assert not (tmp_path / "ev" / "eval.json").exists()
