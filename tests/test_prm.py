"""nanorm/prm.py: the chain world (texts that round-trip, the exact step labeller on hand-written
chains), Math-Shepherd labels from a stub policy whose completions are known, best-of-N against
a plain loop over every subset, the PRM's step scores against the full forward, and the command
refusing a bad option."""

import itertools
import json
import random

import pytest
import torch
from conftest import tiny_model

from nanorm import prm, rl
from nanorm.base.command import run
from nanorm.rl import arith
from reward import ProcessRewardModel, apply_head
from verifiable import gsm8k_reward

Q = ((5, 3, 2, 7), ("+", "-", "+"))  # 5 + 3 - 2 + 7 = ?, 13


@pytest.fixture(scope="module")
def world():
    _, _, _, meta, tok = arith()  # data/arith, made on first use
    return meta, tok


def test_right_chains_round_trip_and_are_on_track_at_every_step(world):
    meta, tok = world
    assert prm.prompt_text(Q) == "5 + 3 - 2 + 7 = ?"
    assert prm.solution_text(Q) == " 5 + 3 = 8. 8 - 2 = 6. 6 + 7 = 13. The answer is 13."
    rng, longest = random.Random(0), 0
    for _ in range(300):
        q = prm.make_question(rng)
        p, r = prm.encode(tok, q)
        assert tok.decode(p) == prm.prompt_text(q)
        assert tok.decode(r) == prm.solution_text(q).strip()  # the space: the dummy prefix
        ends, texts = prm.split_steps(tok, r)
        assert len(ends) == len(q[1]) + 1  # the operations, then the answer
        assert prm.exact_labels(q, texts) == [1] * len(ends)
        assert all(tok.decode([r[e]]) == "." for e in ends)
        assert gsm8k_reward(tok.decode(r), str(prm.results(q)[-1])) == 1.0
        longest = max(longest, len(p) + len(r))
    assert longest + 8 <= prm.policy_config(meta).max_seq_len


@pytest.mark.parametrize(
    "response, labels",
    [
        (" 5 + 3 = 8. 8 - 2 = 6. 6 + 7 = 13. The answer is 13.", [1, 1, 1, 1]),
        (" 5 + 3 = 8. 8 - 2 = 6. 6 + 7 = 13. The answer is 12.", [1, 1, 1, 0]),  # misstated
        (" 5 + 3 = 8. 8 - 2 = 5. 5 + 7 = 12. The answer is 12.", [1, 0, 0, 0]),  # wrong value
        (" 5 + 4 = 9. 9 - 2 = 7. 7 + 7 = 14. The answer is 14.", [0, 0, 0, 0]),  # wrong operand
        (" 5 - 3 = 2. 2 - 2 = 0. 0 + 7 = 7. The answer is 7.", [0, 0, 0, 0]),  # wrong operator
        (" 5 + 3 = 8. 7 - 2 = 5. 6 + 7 = 13. The answer is 13.", [1, 0, 0, 0]),  # not from 8
        (" 5 + 3 = 8. 8 - 2 = 6. 6 + 7 = 13. 13 + 1 = 14. The answer is 14.", [1, 1, 1, 0, 0]),
        (" 5 + 3 = 8. 8 - 2 = 6. The answer is 6.", [1, 1, 0]),  # an answer too early
        (" The answer is 13.", [0]),  # no operation: the answer is too early
        (" 5 + 3 = 8 8 - 2", [0]),  # no ".": one step, the whole response
    ],
)
def test_exact_labels_of_hand_written_chains(world, response, labels):
    _, tok = world
    r = prm.encode(tok, Q, response)[1]
    ends, texts = prm.split_steps(tok, r)
    assert prm.exact_labels(Q, texts) == labels
    assert len(ends) == len(labels)


class StubPolicy(torch.nn.Module):
    """generate() appends a known answer: after one step, right in even rows and wrong in odd
    ones; after two steps always wrong; after three, or the answer, always right."""

    def __init__(self, tok, dot):
        super().__init__()
        self.tok, self.dot = tok, dot
        self.right = tok.encode("The answer is 13.", eos=True)
        self.wrong = tok.encode("The answer is 12.", eos=True)

    def generate(self, tokens, max_new_tokens, temperature, attention_mask, eos_id, pad_id):
        rows = []
        for i, row in enumerate(tokens.tolist()):
            steps = row.count(self.dot)
            right = {1: i % 2 == 0, 2: False, 3: True, 4: True}[steps]
            rows.append(row + (self.right if right else self.wrong))
        assert len({len(r) for r in rows}) == 1  # 12 and 13 are two tokens each
        return torch.tensor(rows)


def test_math_shepherd_labels_from_known_completions(world):
    meta, tok = world
    p, r = prm.encode(tok, Q)
    ends, texts = prm.split_steps(tok, r)
    sols = [dict(q=Q, prompt=p, response=r, ends=list(ends))]
    args = prm.parse_args([])
    prm.math_shepherd(StubPolicy(tok, tok.encode(".")[-1]), tok, sols, 4, args, meta)
    assert sols[0]["soft"] == [0.5, 0.0, 1.0, 1.0]
    assert sols[0]["hard"] == [1.0, 0.0, 1.0, 1.0]


def slow_best_of_n(scores, gold, n):
    """Every subset of n, its best score's solutions sharing the pick."""
    total, subsets = 0.0, list(itertools.combinations(range(len(scores)), n))
    for idx in subsets:
        top = max(scores[i] for i in idx)
        won = [gold[i] for i in idx if scores[i] == top]
        total += sum(won) / len(won)
    return total / len(subsets)


def test_best_of_n_equals_a_plain_loop_over_every_subset():
    scores = [0.3, 0.9, 0.9, 0.1, 0.5, 0.9, 0.2, 0.5]  # ties at 0.9 and 0.5
    gold = [1, 0, 1, 1, 0, 0, 1, 1]
    for n in range(1, len(scores) + 1):
        got = rl.best_of_n_gold([scores], [gold])[n - 1]
        assert got == pytest.approx(slow_best_of_n(scores, gold, n))
        combos = list(itertools.combinations(range(len(gold)), n))
        anyone = sum(max(gold[i] for i in idx) for idx in combos) / len(combos)
        assert prm.pass_at_n(gold, n) == pytest.approx(anyone)
    assert rl.best_of_n_gold([scores], [gold], 1)[0] == pytest.approx(sum(gold) / len(gold))


def test_majority_vote_counts_answers_and_splits_ties():
    answers, gold = ["3", "3", "4", None], [1, 1, 0, 0]
    assert prm.majority(answers, gold, [[0, 1, 2]]) == 1.0
    assert prm.majority(answers, gold, [[0, 2]]) == 0.5  # a tie: either answer, at random
    assert prm.majority(answers, gold, [[2, 3]]) == 0.0  # no answer, no vote
    assert prm.majority(answers, gold, [[3]]) == 0.0
    assert prm.majority(answers, gold, [[0, 2], [0, 1]]) == 0.75


def test_step_scores_are_the_head_on_the_full_forward_at_the_step_ends(world):
    meta, tok = world
    rng = random.Random(1)
    sols = []
    for _ in range(3):  # rows of different lengths and step counts: padding on both axes
        q = prm.make_question(rng)
        p, r = prm.encode(tok, q)
        sols.append(dict(q=q, prompt=p, response=r, ends=list(prm.split_steps(tok, r)[0])))
        sols[-1].update(exact=[1] * len(sols[-1]["ends"]), gold=1)
    tokens, mask, ends, labels, _ = prm.batch(sols, meta["pad_id"], "exact")
    model = tiny_model(ProcessRewardModel, vocab_size=meta["vocab_size"], max_seq_len=128)
    got = model.step_scores(tokens, mask, ends)
    full = apply_head(model.head, model.backbone.hidden_states(tokens, mask))  # (B, T)
    for b, s in enumerate(sols):
        n = len(s["ends"])
        assert (ends[b, n:] == -1).all() and (ends[b, :n] >= 0).all()
        assert torch.allclose(got[b, :n], full[b, ends[b, :n]], atol=1e-5)
        assert tok.decode(tokens[b, ends[b, :n]].tolist()).replace(" ", "") == "." * n


@pytest.mark.parametrize(
    "args, words",
    [
        (["--labels", "both"], ["--labels", "hard, soft"]),
        (["--rollouts", "0"], ["--rollouts", ">= 1"]),
        (["--max_new_tokens", "300"], ["--max_new_tokens 300", "256"]),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as e:
        run(prm.main, [*args, "--out_dir", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_tiny_run_writes_its_rows(tmp_path):
    out = tmp_path / "run"
    sizes = ["--sft_steps", "2", "--train_solutions", "3", "--rollouts", "2", "--rm_steps", "2"]
    sizes += ["--batch_size", "2", "--eval_questions", "2", "--samples", "4", "--subsets", "3"]
    rows = prm.main([*sizes, "--max_new_tokens", "24", "--out_dir", str(out)])
    written = [json.loads(line) for line in (out / "prm.jsonl").read_text().splitlines()]
    assert written == rows and [r.get("n") for r in rows[2:]] == [1, 2, 4]
    assert (out / "prm.png").stat().st_size > 0
