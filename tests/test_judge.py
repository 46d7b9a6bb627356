"""The generative judge (nanorm/judge.py, reward.GenerativeJudge): its rows as the built-in
tokenizer writes the text, its reward against the plain forward with either padding, its loss's
targets, the A/B rows in both orders, the position-bias statistics on known picks, and the
command's refusals and files."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import CHOSEN, PROMPTS, REJECTED, pad, tiny_model

from data.pairs import PairDataset
from data.tokenizer import load_tokenizer
from nanorm import judge as J
from nanorm.base.command import UsageError, run
from reward import GenerativeJudge


@pytest.fixture(scope="module")
def arith(built_in_arith):
    """(tokenizer, JudgeText, val pairs) of the built-in data."""
    with open(f"{built_in_arith}/meta.json") as f:
        meta = json.load(f)
    tok = load_tokenizer(meta["tokenizer"])
    val = PairDataset(f"{built_in_arith}/val.npz")
    return tok, J.JudgeText.from_tokenizer(tok, meta["end_id"]), val


def test_the_row_ends_with_the_space_and_the_verdict_is_the_letter_after_it(arith):
    tok, text, val = arith
    assert tok.decode([text.yes]) == "Y" and tok.decode([text.no]) == "N"
    assert tok.decode([text.a]) == "A" and tok.decode([text.b]) == "B"
    for i in range(20):
        p, c, _ = val[i]
        row = text.yes_no_row(p, c)
        assert row[-1] == text.space and text.end_id not in row[len(p) :]
        said = tok.decode(row + tok.encode(" Yes")[1:])  # the row, then 'Y' 'e' 's'
        assert said.endswith(tok.decode(c).strip() + " Is the answer correct? Yes")
        # exactly how the tokenizer writes that text (BOS aside): the row is the text's tokens
        assert tok.encode(said) == row[1:] + tok.encode(" Yes")[1:]


def test_the_a_b_row_swaps_the_answers_and_the_label(arith):
    tok, text, val = arith
    swap = torch.tensor([False, True])
    tokens, mask, labels = J.a_b_batch(val, [0, 1], text, 2, swap)
    assert labels.tolist() == [1, 0]  # 1: the right answer is A
    for b, s in enumerate(swap.tolist()):
        p, c, r = val[b]
        first, second = (r, c) if s else (c, r)
        shown = tok.decode(tokens[b][mask[b].bool()].tolist())
        want = f"Answer A: {tok.decode(first).strip()} Answer B: {tok.decode(second).strip()}"
        assert want in shown and shown.endswith("Which is correct? ")
        assert tokens[b][mask[b].bool()][-1] == text.space


def test_the_yes_no_batch_labels_the_right_rows_1(arith):
    _, text, val = arith
    tokens, mask, labels = J.yes_no_batch(val, [3, 4], text, 2)
    assert labels.tolist() == [1, 1, 0, 0]
    for b, (i, which) in enumerate([(3, 1), (4, 1), (3, 2), (4, 2)]):
        row = text.yes_no_row(val[i][0], val[i][which])
        assert tokens[b][: len(row)].tolist() == row and mask[b].sum() == len(row)


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_reward_is_the_plain_forwards_p_yes_at_the_last_real_token(side):
    model = tiny_model()
    judge = GenerativeJudge(model, yes_id=7, no_id=8)
    rows = [p + c for p, c in zip(PROMPTS, CHOSEN, strict=True)]
    rows += [p + r for p, r in zip(PROMPTS, REJECTED, strict=True)]
    tokens, mask = pad(rows, side, pad_id=3)
    with torch.no_grad():
        got = judge(tokens, mask)
        plain = [model(torch.tensor([r]))[0, -1].softmax(-1)[7].item() for r in rows]
    assert torch.allclose(got, torch.tensor(plain), atol=1e-6), (got, plain)


def test_the_loss_asks_yes_for_label_1_and_no_for_label_0():
    model = tiny_model()
    judge = GenerativeJudge(model, yes_id=7, no_id=8)
    rows = [p + c for p, c in zip(PROMPTS, CHOSEN, strict=True)]
    tokens, mask = pad(rows)
    labels = torch.tensor([1, 0])
    with torch.no_grad():
        loss, _ = judge.loss(tokens, mask, labels)
        logp = [F.log_softmax(model(torch.tensor([r]))[0, -1], -1) for r in rows]
    plain = -(logp[0][7] + logp[1][8]) / 2
    assert loss.item() == pytest.approx(plain.item(), rel=1e-5)
    swapped = -(logp[0][8] + logp[1][7]) / 2  # the targets swapped: a different loss
    assert abs(plain.item() - swapped.item()) > 1e-3


def test_position_stats_on_known_picks():
    # five pairs; True: the judge said A. Shown right-first, then the same pairs swapped.
    right_first = torch.tensor([True, True, True, False, False])
    right_second = torch.tensor([True, False, True, False, True])
    s = J.position_stats(right_first, right_second)
    assert s["acc_right_first"] == pytest.approx(0.6)  # pairs 0, 1, 2 picked A, the right one
    assert s["acc_right_second"] == pytest.approx(0.4)  # pairs 1, 3 picked B, now the right one
    assert s["acc"] == pytest.approx(0.5)
    assert s["consistency"] == pytest.approx(0.4)  # pair 1 (right twice), pair 4 (wrong twice)
    assert s["first_rate"] == pytest.approx(0.6)  # 6 of the 10 judgments say A
    always_a = J.position_stats(torch.ones(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool))
    assert always_a["first_rate"] == 1 and always_a["consistency"] == 0 and always_a["acc"] == 0.5


@pytest.mark.parametrize(
    "args, words",
    [
        (["--judge", "ab"], ["--judge", "yes_no, a_b"]),
        (["--lr", "0"], ["--lr", "> 0"]),
        (["--pairs", "10", "--batch_size", "32"], ["--pairs 10", "--batch_size"]),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as e:
        run(J.main, [*args, "--out_dir", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("kind", J.JUDGES)
def test_a_tiny_run_writes_its_log_and_policy(tmp_path, kind):
    out = tmp_path / "run"
    args = ["--out_dir", str(out), "--sft_steps", "2", "--steps", "3", "--batch_size", "4"]
    args += ["--pairs", "16", "--eval_pairs", "8", "--log_interval", "1", "--judge", kind]
    zero, tuned = J.main(args)
    logged = [json.loads(line) for line in (out / "judge.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2, 3]
    assert logged[-1]["zero_shot"] == zero and logged[-1]["fine_tuned"] == tuned
    assert (out / "judge_policy.pt").is_file()
    user = tmp_path / "user"  # a file of the user's where the log goes: refused, kept
    user.mkdir()
    (user / "judge.jsonl").write_text("mine")
    with pytest.raises(UsageError, match="not a file nanoRM wrote"):
        J.main([*args, "--out_dir", str(user), "--cache_dir", str(out)])
    assert (user / "judge.jsonl").read_text() == "mine"
