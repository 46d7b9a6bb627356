"""What nanoRM does under faults and hostile files: a resume that would change the run, or go
backwards; two runs in one --out_dir; a run whose weights stop being finite; checkpoint files
and directories that claim sizes they do not hold. Each is one line (UsageError, printed
by run with exit status 2), fast, and nothing kept is lost."""

import fcntl
import json
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT
from launcher import python

import nanorm.ckpt
import train_rm
from data.arith.prepare import main as prepare_arith
from nanorm.base.command import UsageError
from nanorm.ckpt import load_reward_model
from reward import RewardModel


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "256", "--n_val", "32"])
    return str(d)


def run(arith, out, *args):
    argv = ["--dataset", arith, "--out_dir", str(out), "--eval_pairs", "32", "--batch_size", "8"]
    argv += ["--dtype", "float32", "--lm_coef", "0", "--log_interval", "1"]
    return train_rm.main(argv + [str(a) for a in args])


def test_resume_refuses_to_change_the_run_or_go_back(arith, tmp_path):
    run(arith, tmp_path, "--max_iters", 4, "--eval_interval", 2)
    before = (tmp_path / "ckpt.pt").read_bytes()
    for change, words in (
        (["--batch_size", 4], "8 pairs a step (--batch_size x --grad_accum x processes), this one"),
        (["--lr", 0.01, "--seed", 7], "--lr 0.003 --seed 1337, this one asks --lr 0.01 --seed 7"),
        (["--dataset", arith + "/"], "--dataset"),
    ):
        argv = ["--dataset", arith, *change] if change[0] == "--dataset" else change
        with pytest.raises(UsageError, match="--resume: .*ckpt.pt is a run with") as e:
            run(arith, tmp_path, "--max_iters", 6, "--resume", *argv)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="at step 4, past --max_iters 2"):
        run(arith, tmp_path, "--max_iters", 2, "--resume")
    assert (tmp_path / "ckpt.pt").read_bytes() == before  # refused before anything was written
    assert not (tmp_path / ".lock").exists()
    run(arith, tmp_path, "--max_iters", 6, "--eval_interval", 3, "--resume")  # a longer run: yes
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 6


def test_a_run_owns_its_out_dir(arith, tmp_path):
    """A live run's lock (a held flock) refuses a second run, naming it; a lock nobody holds is
    taken over, whatever its text says (a dead run's pid, a live pid reused, nothing, garbage)."""
    tmp_path.mkdir(exist_ok=True)
    held = open(tmp_path / ".lock", "w")
    held.write(f"{os.getpid()} {socket.gethostname()}\n")
    held.flush()
    fcntl.flock(held, fcntl.LOCK_EX)  # a run that is alive holds it
    with pytest.raises(UsageError, match=f"in use by another run \\(process {os.getpid()}"):
        run(arith, tmp_path, "--max_iters", 1)
    held.close()  # the run ended (or was killed): the kernel dropped its lock
    assert not (tmp_path / "ckpt.pt").exists()
    for text in (f"{os.getpid()} {socket.gethostname()}\n", "", "\x00garbage"):
        (tmp_path / ".lock").write_text(text)
        run(arith, tmp_path, "--max_iters", 1, "--overwrite")
        assert (tmp_path / "ckpt.pt").exists() and not (tmp_path / ".lock").exists()


def test_a_lock_that_is_no_file_is_one_line(tmp_path):
    """out_dir/.lock as a folder, a FIFO or a link (to /dev/zero): refused in one line, nothing
    followed, nothing hangs."""
    from nanorm.run_dir import claim

    for make in (os.mkdir, os.mkfifo, lambda p: os.symlink("/dev/zero", p)):
        d = tmp_path / make.__name__.replace("<lambda>", "link")
        d.mkdir()
        make(d / ".lock")
        with pytest.raises(UsageError, match="is not a lock file.*remove it"):
            claim(str(d))


def _claim_once(out_dir, start, done, results):
    from nanorm.run_dir import claim, release

    start.wait()
    try:
        lock = claim(out_dir)
    except UsageError:
        results.put(0)
        done.wait()
        return
    results.put(1)
    done.wait()  # every process has tried while this one holds the folder
    release(lock)


def test_processes_that_take_over_a_stale_lock_together_get_one_owner(tmp_path):
    """Four processes claiming a folder with a stale lock at once: exactly one owns it, every
    time (taking over is the kernel's flock, not a remove that could delete a new lock)."""
    ctx = multiprocessing.get_context("fork")
    for trial in range(10):
        out_dir = tmp_path / str(trial)
        out_dir.mkdir()
        (out_dir / ".lock").write_text("99999999 elsewhere\n")  # stale: nobody holds it
        start, done, results = ctx.Barrier(4), ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(target=_claim_once, args=(str(out_dir), start, done, results))
            for _ in range(4)
        ]
        for p in procs:
            p.start()
        owners = sum(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert owners == 1, (trial, owners)


@pytest.mark.slow
def test_two_processes_in_one_out_dir(arith, tmp_path):
    """Started together, one run trains and the other is refused in one line, exit status 2."""
    cmd = [
        sys.executable,
        str(ROOT / "train_rm.py"),
        "--dataset",
        arith,
        "--out_dir",
        str(tmp_path),
    ]
    cmd += ["--max_iters", "30", "--batch_size", "8", "--eval_pairs", "16", "--lm_coef", "0"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (tmp_path / ".lock").exists() and time.time() - t0 < 120:
        time.sleep(0.02)
    second = python(cmd[1:], timeout=300)
    first.wait(timeout=600)
    assert first.returncode == 0, first.stderr.read()[-2000:]
    assert second.returncode == 2 and second.stderr.count("\n") == 1
    assert "in use by another run" in second.stderr or "holds a run" in second.stderr
    rows = [json.loads(r) for r in open(tmp_path / "log.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "train"] == [25, 30]  # one run's rows


@pytest.mark.slow
def test_diverging_weights_stop_the_run_and_keep_the_last_finite_checkpoint(
    arith, tmp_path, monkeypatch
):
    real = torch.optim.AdamW.step

    def blow_up(self, *a, **k):
        out = real(self, *a, **k)
        blow_up.calls += 1
        if blow_up.calls == 4:  # the update of step 4, whose loss was finite: its save sees it
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    blow_up.calls = 0
    monkeypatch.setattr(torch.optim.AdamW, "step", blow_up)
    with pytest.raises(UsageError, match="not finite at step .*: stopping; .*ckpt.pt keeps") as e:
        run(arith, tmp_path, "--max_iters", 8, "--eval_interval", 2)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 2 and all(torch.isfinite(t).all() for t in ckpt["model"].values())
    # a non-finite checkpoint (written by hand) is refused by scoring, in one line
    ckpt["model"]["head.weight"][0, 0] = float("nan")
    torch.save(ckpt, tmp_path / "nan.pt")
    with pytest.raises(UsageError, match="not finite"):
        load_reward_model(tmp_path / "nan.pt")
    p = python(["-m", "nanorm.score", "--ckpt", tmp_path / "nan.pt", "--response", "7"])
    assert p.returncode == 2 and "not finite" in p.stderr and p.stderr.count("\n") == 1


def hf_dir(root, name, config, weights=True):
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if weights:
        torch.save({"model.embed_tokens.weight": torch.zeros(4, 8)}, d / "pytorch_model.bin")
    return d


BASE = dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, vocab_size=4)
BASE |= dict(intermediate_size=16)


def hostile_files(root):
    """(what, path, words of its one-line refusal): files of a few KB that claim what they do
    not hold."""
    files = [
        ("config.json a list", hf_dir(root, "a", [1, 2]), "a JSON list"),
        ("config.json without keys", hf_dir(root, "b", {"hidden_size": 8}), "no 'num_attention"),
        ("zero heads", hf_dir(root, "c", BASE | dict(num_attention_heads=0)), "positive integers"),
        ("a string size", hf_dir(root, "d", BASE | dict(hidden_size="8")), "positive integers"),
        ("a negative size", hf_dir(root, "e", BASE | dict(vocab_size=-4)), "vocab_size must be"),
        (
            "10^9 layers",
            hf_dir(root, "f", BASE | dict(num_hidden_layers=10**9)),
            "claims 1000000000",
        ),
        (
            "vocab x dim of 40 GB",
            hf_dir(
                root, "g", BASE | dict(vocab_size=10**7, hidden_size=4096, num_attention_heads=32)
            ),
            "token embeddings (4, 8)",
        ),  # fmt: skip
    ]
    bad_bin = hf_dir(root, "h", BASE, weights=False)
    torch.save([1, 2, 3], bad_bin / "pytorch_model.bin")
    files.append(("pytorch_model.bin a list", bad_bin, "not a state dict"))
    for name, header in (
        ("llama2.c zero heads", (64, 128, 10**6, 0, 4, 512, 256)),
        ("llama2.c 10^6 layers", (4096, 11008, 10**6, 32, 32, 32000, 4096)),
    ):
        path = root / f"{name.replace(' ', '_')}.bin"
        path.write_bytes(struct.pack("7i", *header) + bytes(64))
        files.append((name, path, "header"))
    for name, config, words in (
        ("ckpt.pt of 10^8 layers", dict(dim=64, n_layers=10**8, n_heads=4, vocab_size=10**6),
         "token embeddings none"),
        ("ckpt.pt config a list", [1], "its config is a list"),
    ):  # fmt: skip
        path = root / f"{name.replace(' ', '_')}.pt"
        torch.save({"kind": "RewardModel", "config": config, "model": {}}, path)
        files.append((name, path, words))
    return files


def test_hostile_checkpoints_are_refused_before_memory_is_spent(tmp_path):
    import resource

    for what, path, words in hostile_files(tmp_path):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for load in (lambda p: RewardModel(pretrained=p), load_reward_model):
            with pytest.raises(UsageError) as e:
                load(path)
            assert words in str(e.value) and "\n" not in str(e.value), what
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
        assert grown_mb < 200, (what, grown_mb)


@pytest.mark.slow
def test_hostile_checkpoints_are_one_line_in_every_entry_point(arith, tmp_path):
    what, path, words = hostile_files(tmp_path)[5]  # 10^9 layers
    for argv in (
        ["train_rm.py", "--dataset", arith, "--out_dir", str(tmp_path / "o"), "--init", str(path)],
        ["eval_rm.py", "--ckpt", str(path), "--data", arith, "--out", str(tmp_path / "e")],
        ["-m", "nanorm.score", "--ckpt", str(path), "--response", "7", "--tokenizer",
         os.path.join(arith, "tok.model")],
    ):  # fmt: skip
        p = python(argv)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (argv[0], p.stderr[-800:])
        assert str(path) in p.stderr, (
            argv[0],
            p.stderr,
        )  # (train_rm may refuse its vocabulary first)


@pytest.mark.slow
def test_torn_log_line_full_disk_and_output_paths_that_are_files(arith, tmp_path, monkeypatch):
    """--resume drops a log line cut by a kill (with a note); a save that fails for a full disk
    is one line and keeps the previous checkpoint; an --out_dir or --out that is a file is
    refused in one line, the file untouched."""
    run(arith, tmp_path, "--max_iters", 2, "--eval_interval", 2)
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 2, "split": "tr')  # torn
    run(arith, tmp_path, "--max_iters", 4, "--eval_interval", 2, "--resume")
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]  # every line whole
    assert rows[-1]["step"] == 4
    before = (tmp_path / "ckpt.pt").read_bytes()

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nanorm.ckpt, "save_checkpoint", full)
    with pytest.raises(UsageError, match="could not be written at step 6 .No space left") as e:
        run(arith, tmp_path, "--max_iters", 6, "--eval_interval", 2, "--resume")
    assert "previous one is kept" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    monkeypatch.undo()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(UsageError, match="is a file"):
        run(arith, a_file, "--max_iters", 1)
    p = python(["eval_rm.py", "--ckpt", tmp_path / "ckpt.pt", "--data", arith, "--out", a_file])
    assert p.returncode == 2 and "is a file" in p.stderr and a_file.read_text() == "mine"


@pytest.mark.slow
def test_eval_reads_json_arrays_and_refuses_a_max_len_that_cuts_everything(arith, tmp_path):
    run(arith, tmp_path, "--max_iters", 1)
    rows = [{"prompt": "What is 2 + 2?", "chosen": " 4", "rejected": " 5"}] * 6
    (tmp_path / "pairs.json").write_text(json.dumps(rows))  # one array, as prepare reads
    eval_rm = ["eval_rm.py", "--ckpt", tmp_path / "ckpt.pt", "--data", tmp_path / "pairs.json"]
    p = python([*eval_rm, "--out", tmp_path / "e"])
    assert p.returncode == 0, p.stderr[-1500:]
    assert json.load(open(tmp_path / "e" / "eval.json"))["overall"]["n"] == 6
    p = python([*eval_rm, "--out", tmp_path / "f", "--max_len", "1"])
    assert p.returncode == 2 and "--max_len must be at least 8" in p.stderr


@pytest.mark.slow
def test_export_never_replaces_what_it_did_not_write(arith, tmp_path):
    pytest.importorskip("safetensors")
    run(arith, tmp_path / "run", "--max_iters", 1)
    score = ["-m", "nanorm.score", "--ckpt", tmp_path / "run" / "ckpt.pt"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (tmp_path / "a_file").write_text("mine")
    for target in (mine, tmp_path / "a_file"):
        p = python([*score, "--export_hf", target])
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-800:]
    assert (mine / "notes.txt").read_text() == "mine" and sorted(os.listdir(mine)) == ["notes.txt"]
    assert (tmp_path / "a_file").read_text() == "mine"
    for _ in range(2):  # a new folder, then the same export again over itself
        p = python([*score, "--export_hf", tmp_path / "hf"])
        assert p.returncode == 0, p.stderr[-800:]
