"""A user's mistake is one line on stderr naming the file or option and what to do,
exit status 2, no traceback; and nothing is lost: a refused run leaves the earlier run's files
byte for byte. The entry points run as a user runs them (a subprocess in the project root)
where the wiring matters, and through run in-process where only the message does."""

import os

import pytest
import torch
from conftest import ROOT
from launcher import python

import train_rm
from data.arith.prepare import main as prepare_arith
from nanorm.base.command import UsageError, run

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
# one step on the built-in arithmetic pairs (train_rm prepares data/arith when it is missing)
TINY = ["--max_iters", 1, "--eval_interval", 1, "--batch_size", 4, "--eval_pairs", 8]


def cli(script, *args):
    # a library script (nanorm/x.py) runs as python -m nanorm.x, as its docstring says
    where = (
        ["-m", script[:-3].replace("/", ".")] if script.startswith("nanorm/") else [ROOT / script]
    )
    return python([*where, *args], env=ENV, timeout=300)


def one_line(stderr, *words):
    """The single error line, checked to name each of words."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


def refused(p, *words):
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    return one_line(p.stderr, *words)


def refused_in_process(capsys, main, argv, *words):
    with pytest.raises(SystemExit) as e:
        run(main, [str(a) for a in argv])
    assert e.value.code == 2
    return one_line(capsys.readouterr().err, *words)


def snapshot(out):
    return {f: (out / f).read_bytes() for f in ("ckpt.pt", "log.jsonl")}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A finished one-step run, the thing the refused runs must not touch."""
    out = tmp_path_factory.mktemp("run")
    p = cli("train_rm.py", "--out_dir", out, *TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_unexpected_failures_keep_their_traceback():
    def buggy(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run(buggy)

    def mistake(argv):
        raise UsageError("x.pt not found")

    with pytest.raises(SystemExit) as e:
        run(mistake)
    assert e.value.code == 2


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "huge"], ["--model must be one of nano, tiny, small, medium", "'huge'"]),
        (["--loss", "hinge"], ["--loss must be one of logsig, logexp, bce"]),
        (["--dtype", "float16"], ["--dtype must be one of auto, float32, bfloat16"]),
        (["--device", "tpu"], ["--device must be auto, cpu, cuda, cuda:N or mps"]),
        (["--batch_size", "0"], ["--batch_size must be >= 1, got 0"]),
        (["--grad_accum", "0"], ["--grad_accum must be >= 1"]),
        (["--max_iters", "-1"], ["--max_iters must be >= 0"]),
        (["--eval_interval", "0"], ["--eval_interval must be >= 1"]),
        (["--lr", "0"], ["--lr must be > 0"]),
        (["--lr", "nan"], ["--lr must be a finite number", "nan"]),
        (["--weight_decay", "inf"], ["--weight_decay must be a finite number"]),
        (["--margin=-inf"], ["--margin must be a finite number"]),
        (["--seed", str(2**70)], ["--seed must fit in 64 bits"]),
        (["--max_iters", str(10**23)], ["--max_iters must fit in 64 bits"]),
        (["--dropout", "1"], ["--dropout must be in [0, 1)"]),
        (["--train_layers", "-1"], ["--train_layers must be >= 0"]),
        (["--batch_size", "four"], ["--batch_size", "invalid int value: 'four'"]),
        (["--resume", "maybe"], ["--resume", "expected true/false, 1/0 or yes/no, got 'maybe'"]),
        (["--pack", "ja"], ["--pack", "'ja'"]),
        (["--resume", "--overwrite"], ["--resume", "--overwrite"]),
    ],
)
def test_train_options_are_checked_up_front(capsys, tmp_path, argv, words):
    refused_in_process(capsys, train_rm.main, ["--out_dir", tmp_path, *argv], *words)
    assert not os.listdir(tmp_path)  # refused before anything is written


def test_booleans_read_as_written():
    for no, yes in (("no", "YES"), ("0", "1"), ("False", "true")):
        cfg = train_rm.parse_args(["--pack", no, "--bucket", yes, "--grad_ckpt"])
        assert (cfg.pack, cfg.bucket, cfg.grad_ckpt) == (False, True, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only machine")
def test_cuda_on_a_cpu_machine(capsys, tmp_path):
    where = "this torch build" if torch.version.cuda is None else "this machine (no GPU seen)"
    msg = refused_in_process(capsys, train_rm.main, ["--out_dir", tmp_path, "--device", "cuda"])
    assert msg.endswith(f"error: --device cuda: CUDA is not available in {where}; use --device cpu")


@pytest.mark.slow
def test_second_run_into_the_same_out_dir_is_refused_and_nothing_lost(first_run):
    before = snapshot(first_run)
    p = cli("train_rm.py", "--out_dir", first_run, *TINY)
    refused(p, first_run / "ckpt.pt", "--resume", "--overwrite")
    assert snapshot(first_run) == before


@pytest.mark.slow
def test_torchrun_rank0_refuses_for_every_rank(first_run):
    before = snapshot(first_run)
    cmd = [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train_rm.py"),
        "--out_dir",
        str(first_run),
        "--device",
        "cpu",
        *map(str, TINY),
    ]
    p = python(cmd, env=ENV, timeout=300)
    assert p.returncode != 0
    # both ranks stop with rank 0's one line (torchrun then adds its own report of the exit)
    assert p.stderr.count(f"error: {first_run} holds a run ({first_run / 'ckpt.pt'})") == 2
    assert snapshot(first_run) == before


def test_resume_says_where_and_overwrite_replaces(first_run, tmp_path, capsys):
    out = tmp_path / "again"
    out.mkdir()
    for f, data in snapshot(first_run).items():
        (out / f).write_bytes(data)
    run(train_rm.main, ["--out_dir", str(out), "--resume", *map(str, TINY), "--max_iters", "2"])
    assert f"resuming from step 1 of {out / 'ckpt.pt'}" in capsys.readouterr().out
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2
    run(train_rm.main, ["--out_dir", str(out), "--overwrite", *map(str, TINY)])
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 1
    assert '"step": 2' not in (out / "log.jsonl").read_text()  # a new run, a new log


def test_resume_without_a_checkpoint(capsys, tmp_path):
    msg = refused_in_process(capsys, train_rm.main, ["--out_dir", tmp_path, "--resume", *TINY])
    assert msg.endswith(
        f"{tmp_path / 'ckpt.pt'} not found: nothing to resume (drop --resume to start a new run)"
    )
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_truncated_checkpoint_is_named_corrupt(first_run, tmp_path):
    out = tmp_path / "cut"
    out.mkdir()
    data = (first_run / "ckpt.pt").read_bytes()
    (out / "ckpt.pt").write_bytes(data[: len(data) // 2])
    before = (out / "ckpt.pt").read_bytes()
    p = cli("train_rm.py", "--out_dir", out, "--resume", *TINY)
    refused(p, f"{out / 'ckpt.pt'} is corrupt (truncated")
    assert (out / "ckpt.pt").read_bytes() == before
    p = cli("nanorm/score.py", "--ckpt", out / "ckpt.pt", "--response", "hi")
    refused(p, f"{out / 'ckpt.pt'} is corrupt (truncated")


def test_missing_dataset_names_folder_and_prepare_command(capsys, tmp_path):
    argv = ["--out_dir", tmp_path / "o", "--dataset", "hh_rlhf/nowhere", *TINY]
    d = os.path.join(ROOT, "data", "hh_rlhf/nowhere")
    msg = refused_in_process(capsys, train_rm.main, argv, d)
    assert f"make it with python data/hh_rlhf/prepare.py --out_dir {d}" in msg
    assert not os.path.exists(tmp_path / "o")


def test_resume_on_another_vocabulary(first_run, tmp_path, capsys):
    other = tmp_path / "arith300"
    prepare_arith(
        ["--out_dir", str(other), "--n_train", "200", "--n_val", "20", "--vocab_size", "300"]
    )
    capsys.readouterr()
    before = snapshot(first_run)
    argv = ["--out_dir", first_run, "--dataset", other, "--resume", *TINY]
    msg = refused_in_process(capsys, train_rm.main, argv, first_run / "ckpt.pt")
    assert "another vocabulary (vocab_size 320, the dataset's is 300)" in msg
    assert snapshot(first_run) == before


def test_train_layers_beyond_the_model(capsys, tmp_path):
    argv = ["--out_dir", tmp_path, "--train_layers", 5, "--lm_coef", 0, *TINY]
    refused_in_process(capsys, train_rm.main, argv, "--train_layers 5: the model has 4 layers")


@pytest.mark.slow
def test_reward_and_eval_cli_errors(first_run, tmp_path):
    p = cli("nanorm/score.py", "--ckpt", tmp_path / "none.pt", "--response", "hi")
    refused(p, f"{tmp_path / 'none.pt'} not found")
    rows = tmp_path / "pairs.jsonl"
    rows.write_bytes(b'{"prompt": "1 + 1", "chosen": " 2", "rejected": " 3"}\n{"prompt": 1}\n')
    p = cli("nanorm/score.py", "--ckpt", first_run / "ckpt.pt", "--pairs", rows)
    refused(p, "accuracy on pairs is eval_rm.py's: python eval_rm.py --ckpt")
    ev = ["eval_rm.py", "--ckpt", first_run / "ckpt.pt", "--out", tmp_path / "ev", "--data"]
    p = cli(*ev, rows)  # evaluation skips a bad row, and says which
    assert p.returncode == 0 and f"skipping {rows}:2: missing key: 'chosen'" in p.stdout
    p = cli(*ev, rows, "--batch_size", 0)
    refused(p, "--batch_size must be >= 1, got 0")
    data = (first_run / "ckpt.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    p = cli("eval_rm.py", "--ckpt", tmp_path / "cut.pt", "--out", tmp_path / "ev", "--data", rows)
    refused(p, f"{tmp_path / 'cut.pt'} is corrupt (truncated")
    if not torch.cuda.is_available():
        p = cli(*ev, rows, "--device", "cuda")
        refused(p, "CUDA is not available", "--device cpu")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--n_train", "0"], ["--n_train must be >= 1"]),
        (["--n_val", "0"], ["--n_val must be >= 1"]),
        (["--max_operand", "0"], ["--max_operand must be >= 1"]),
        (["--max_len", "4"], ["--max_len must be >= 8"]),
        (["--vocab_size", "10"], ["--vocab_size must be >= 259"]),
    ],
)
def test_arith_prepare_ranges(capsys, tmp_path, argv, words):
    refused_in_process(capsys, prepare_arith, ["--out_dir", tmp_path, *argv], *words)
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_sample_cli_errors(first_run, tmp_path, capsys):
    import nanorm.sample as sample

    for argv, words in (
        (["--max_new_tokens", -1], ["--max_new_tokens must be >= 0, got -1"]),
        (["--temperature", -0.5], ["--temperature must be >= 0"]),
        (["--top_k", 0], ["--top_k must be >= 1, got 0"]),
        (["--ckpt", tmp_path / "none.bin"], [f"{tmp_path / 'none.bin'} not found"]),
    ):
        refused_in_process(capsys, sample.main, argv, *words)
    data = (first_run / "ckpt.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    p = cli("nanorm/sample.py", "--ckpt", tmp_path / "cut.pt", "--tokenizer", tmp_path / "cut.pt")
    refused(p, f"{tmp_path / 'cut.pt'} is corrupt (truncated")
    p = cli(
        "nanorm/sample.py", "--ckpt", first_run / "ckpt.pt", "--tokenizer", tmp_path / "tok.model"
    )
    refused(p, f"{tmp_path / 'tok.model'} not found")


def test_a_library_script_run_as_a_file_says_how_to_run_it():
    for name in ("score", "sample"):
        p = python([f"nanorm/{name}.py"])
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        assert (
            p.stderr.strip()
            == f"{ROOT}/nanorm/{name}.py is part of the nanorm library: run python -m nanorm.{name}"
        )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--group", "0"], ["--group must be >= 2, got 0"]),
        (["--batch_size", "0"], ["--batch_size must be >= 1, got 0"]),
        (
            ["--algo", "grpo", "--batch_size", "10", "--group", "4"],
            ["--batch_size 10", "--group 4"],
        ),
        (["--minibatches", "200"], ["--minibatches 200 exceeds --batch_size 128"]),
        (["--lam", "1.5"], ["--lam must be in [0, 1], got 1.5"]),
        (["--kl_coef", "nan"], ["--kl_coef must be a finite number"]),
        (["--lr=-1e-4"], ["--lr must be > 0"]),
        (["--algo", "dpo"], ["--algo must be one of ppo, grpo"]),
        (["--seed", str(2**70)], ["--seed must fit in 64 bits"]),
    ],
)
def test_rl_options_are_checked_up_front(capsys, tmp_path, argv, words):
    from nanorm import rl

    refused_in_process(capsys, rl.main, ["--out_dir", tmp_path / "rl", *argv], *words)
    assert not os.path.exists(tmp_path / "rl")  # refused before anything is written


def test_rl_out_dir_that_is_a_file_is_one_line(capsys, tmp_path):
    from nanorm import rl

    (tmp_path / "f").write_text("mine")
    refused_in_process(capsys, rl.main, ["--out_dir", tmp_path / "f"], "--out_dir", "not a folder")
    assert (tmp_path / "f").read_text() == "mine"
