"""Nothing a user has is lost. A command writes only files it made or a previous run of it made,
and says which before it writes (each output folder's record, .nanorm); it never writes through
a link; every refusal is one line naming the input and the fix, exit 2. Each case through the
entry point a user runs (train_rm.py, eval_rm.py, nanorm.score --export_hf, nanorm.rl,
data/prepare.py, RewardModelTrainer.fit): as a subprocess in the project root where the wiring
matters (a lock held by another process, a disk, the files left behind), and through
command.run in-process where only the message and the files kept do.

A full or read-only disk is a real one where the test may mount a small tmpfs (as root, with
mount); elsewhere a folder without write permission stands in for a read-only disk, and a full
disk is tested in-process on the one place that maps it (atomic_write), by an OSError raised
where torch.save would raise it."""

import fcntl
import json
import os
import random
import shutil
import subprocess
from contextlib import contextmanager

import pytest
import torch
from conftest import ROOT, shared_path, tiny_model
from launcher import python

import train_rm
from data.arith.prepare import main as prepare_arith
from nanorm.base import command
from nanorm.base.command import MARKER, UsageError, append_text, atomic_write
from reward import RewardModel

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
TINY = ["--max_iters", 1, "--eval_interval", 1, "--batch_size", 4, "--eval_pairs", 8]
TINY += ["--dtype", "float32", "--lm_coef", 0]
RL_TINY = ["--max_steps", 1, "--sft_steps", 2, "--proxy_pairs", 64, "--proxy_iters", 2]
RL_TINY += ["--batch_size", 8, "--group", 2]


def cli(*argv):
    """python argv... in the project root, as a user runs it (-m for a library module)."""
    return python(argv, env=ENV)


def refused(p, *words):
    """The one error line of a refused command (exit status 2), checked to name each of words."""
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for w in words:
        assert str(w) in lines[0], (w, lines[0])
    return lines[0]


def refused_here(capsys, main, argv, *words):
    """refused(), for main run in this process by command.run, as its script runs it."""
    with pytest.raises(SystemExit) as e:
        command.run(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    return refused(subprocess.CompletedProcess([], e.value.code, "", err), *words)


def ok(p):
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def contents(folder):
    """{name: bytes} of the regular files in folder (links: their target's path)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.islink(path):
            out[name] = "-> " + os.readlink(path)
        elif os.path.isfile(path):
            out[name] = open(path, "rb").read()
    return out


def record(folder):
    with open(os.path.join(folder, MARKER)) as f:
        return json.load(f)["files"]


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    prepare_arith(["--out_dir", str(d), "--n_train", "128", "--n_val", "16"])
    return d


@pytest.fixture(scope="module")
def first_run(arith, tmp_path_factory):
    """A finished one-step run: its folder, with its record."""
    out = tmp_path_factory.mktemp("first") / "run"
    train_rm.main(["--dataset", str(arith), "--out_dir", str(out), *map(str, TINY)])
    return out


def copy_run(first_run, to, record=True):
    """A copy of the first run's folder (without its record: as an older nanoRM left it)."""
    shutil.copytree(first_run, to, ignore=None if record else shutil.ignore_patterns(MARKER))
    return to


def train_cli(arith, out, *args):
    return cli("train_rm.py", "--dataset", arith, "--out_dir", out, *TINY, *args)


def train_argv(arith, out, *args):
    return ["--dataset", arith, "--out_dir", out, *TINY, *args]


# ----------------------------------------------------------------------------- 1. whose files
def test_train_never_replaces_files_it_did_not_write(arith, tmp_path, capsys):
    """A folder without a run holding the user's log.jsonl, eval.json and curves.png: refused,
    --overwrite or not, naming the file and the fix; every byte kept."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("log.jsonl", "eval.json", "curves.png"):
        (mine / name).write_text(f"my own {name}\n")
    before = contents(mine)
    for flags in ([], ["--overwrite"]):
        argv = train_argv(arith, mine, *flags)
        line = refused_here(capsys, train_rm.main, argv, mine, "move it away", "another --out_dir")
        assert "is not a file nanoRM wrote" in line
    assert contents(mine) == before


@pytest.mark.slow
def test_prepare_records_its_dataset_and_replaces_only_that(tmp_path, capsys):
    """data/prepare.py replaces a dataset whole with --overwrite, but only one it wrote: a
    folder holding the user's own meta.json (and nothing else) was taken for a dataset and
    replaced; a file put beside a dataset, or a forged or oversized record, is refused."""
    from data.prepare import main as prepare

    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    src = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"Q{i}", "chosen": f" a{i}", "rejected": " no"} for i in range(30)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--src", src, "--tokenizer", tok, "--overwrite", "--out_dir"]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "meta.json").write_text('{"my": "notes"}')
    refused_here(capsys, prepare, [*argv, mine], mine, "meta.json", "did not write")
    assert contents(mine) == {"meta.json": b'{"my": "notes"}'}

    data = tmp_path / "data"
    command.run(prepare, [str(a) for a in [*argv, data]])
    assert record(data) == dict.fromkeys(["meta.json", "train.npz", "val.npz"], "data/prepare.py")
    command.run(prepare, [str(a) for a in [*argv, data]])  # its own: replaced with --overwrite
    (data / "notes.txt").write_text("mine")
    refused_here(capsys, prepare, [*argv, data], "notes.txt", "did not write")
    os.remove(data / "notes.txt")
    (data / MARKER).write_bytes(b" " * (command.MAX_RECORD_BYTES + 1))
    refused_here(capsys, prepare, [*argv, data], MARKER, "not nanoRM's record")
    os.remove(data / MARKER)  # as an older nanoRM left it: its meta.json says it is a dataset
    command.run(prepare, [str(a) for a in [*argv, data]])
    assert MARKER in os.listdir(data)


def test_the_arithmetic_prepare_never_writes_over_a_users_file_or_through_a_link(tmp_path, capsys):
    """data/arith/prepare.py wrote its four files into --out_dir with plain open(): over a
    file of the user's, and through a link, to the file it points at."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(victim, linked / "meta.json")
    refused_here(capsys, prepare_arith, ["--out_dir", linked], "meta.json", "link")
    assert victim.read_text() == "the user's"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tok.model").write_text("my tokenizer")
    refused_here(capsys, prepare_arith, ["--out_dir", mine], "tok.model", "not a file nanoRM wrote")
    assert contents(mine) == {"tok.model": b"my tokenizer"}
    out = tmp_path / "arith"
    prepare_arith(["--out_dir", str(out), "--n_train", "64", "--n_val", "8"])
    assert set(record(out)) == {"tok.model", "train.npz", "val.npz", "meta.json"}
    prepare_arith(["--out_dir", str(out), "--n_train", "64", "--n_val", "8"])  # its own again


def test_a_run_records_its_files_and_replaces_only_those(arith, tmp_path):
    """A new run beside the user's notes: its record names what it wrote and nothing else;
    --overwrite and --resume replace those files alone."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["--dataset", str(arith), "--out_dir", str(out), *map(str, TINY)]
    train_rm.main(argv + ["--save_interval", "1"])
    files = record(out)
    assert {"ckpt.pt", "log.jsonl", "curves.png", "eval.json", "ckpt-1.pt"} <= files.keys()
    assert set(files.values()) == {"train_rm.py"} and "notes.txt" not in files
    train_rm.main(argv + ["--overwrite"])
    train_rm.main(argv + ["--resume", "--max_iters", "2", "--save_interval", "2"])
    assert "ckpt-2.pt" in record(out)  # a numbered checkpoint is recorded before it is written
    assert (out / "notes.txt").read_text() == "mine" and not (out / ".lock").exists()


@pytest.mark.slow
def test_an_older_nanorm_run_counts_as_ours_by_its_checkpoint(arith, first_run, tmp_path):
    """A run folder an older nanoRM wrote (no record) is recognised by its ckpt.pt, a training
    checkpoint: --resume and --overwrite go on as before. Without that checkpoint nothing there
    is taken for ours."""
    old = copy_run(first_run, tmp_path / "old", record=False)
    argv = ["--dataset", str(arith), "--out_dir", str(old), *map(str, TINY)]
    train_rm.main(argv + ["--resume", "--max_iters", "2"])
    assert record(old)["ckpt.pt"] == "train_rm.py"
    bare = copy_run(first_run, tmp_path / "bare", record=False)
    (bare / "ckpt.pt").unlink()
    before = contents(bare)
    refused(train_cli(arith, bare), bare / "log.jsonl", "no .nanorm record", "move it away")
    assert contents(bare) == before


def test_eval_never_replaces_files_it_did_not_write(arith, first_run, tmp_path, capsys):
    import eval_rm

    """eval_rm.py --out a folder holding the user's eval.json: refused before the model is
    read, the file kept; into a run's folder: the run's report is train_rm.py's, not its own."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "eval.json").write_text('{"my": "numbers"}')
    ev = ["--ckpt", first_run / "ckpt.pt", "--data", arith]
    words = (mine / "eval.json", "move it away", "another --out")
    refused_here(capsys, eval_rm.main, [*ev, "--out", mine], *words)
    assert (mine / "eval.json").read_text() == '{"my": "numbers"}'
    before = contents(first_run)
    words = ("was written by train_rm.py", "another --out")
    refused_here(capsys, eval_rm.main, [*ev, "--out", first_run], *words)
    assert contents(first_run) == before


@pytest.mark.slow
def test_eval_records_its_report_and_writes_it_again(arith, first_run, tmp_path):
    ev = ["eval_rm.py", "--ckpt", first_run / "ckpt.pt", "--data", arith, "--out", tmp_path / "e"]
    ok(cli(*ev))
    assert record(tmp_path / "e") == dict.fromkeys(
        ["eval.json", "reliability.png", "reward_hist.png", "reward_length.png"], "eval_rm.py"
    )
    ok(cli(*ev))  # its own report: replaced
    older = tmp_path / "older"  # an older nanoRM's report folder (no record): its eval.json says
    shutil.copytree(tmp_path / "e", older, ignore=shutil.ignore_patterns(MARKER))
    ok(cli(*ev[:-1], older))


def test_rl_never_replaces_files_it_did_not_write(tmp_path, capsys):
    """python -m nanorm.rl --out_dir a folder holding the user's rl.jsonl and policy.pt:
    refused at once (before the SFT policy and the proxy are trained), both kept."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "rl.jsonl").write_text('{"my": "log"}\n')
    (mine / "policy.pt").write_bytes(b"my policy")
    before = contents(mine)
    from nanorm import rl

    argv = ["--out_dir", mine, *RL_TINY]
    refused_here(capsys, rl.main, argv, mine / "rl.jsonl", "move it away", "another --out_dir")
    assert contents(mine) == before and sorted(os.listdir(mine)) == ["policy.pt", "rl.jsonl"]


@pytest.mark.slow
def test_rl_records_its_files_and_its_cache_is_only_ever_made(tmp_path):
    """A tiny run records rl.jsonl, rl.png and policy.pt, and runs again over them; a folder in
    the way of the proxy's pairs is refused, not filled."""
    from nanorm import rl

    out = tmp_path / "rl"
    argv = ["--out_dir", str(out), *map(str, RL_TINY)]
    rl.main(argv)
    assert record(out) == dict.fromkeys(["policy.pt", "rl.jsonl", "rl.png"], "nanorm.rl")
    rl.main(argv + ["--seed", "1"])  # its own files (the SFT policy and proxy cached)
    assert [json.loads(r)["step"] for r in (out / "rl.jsonl").read_text().splitlines()] == [0, 1]
    (tmp_path / "cache" / "pairs64").mkdir(parents=True)
    (tmp_path / "cache" / "pairs64" / "train.npz").write_bytes(b"mine")
    with pytest.raises(UsageError, match="pairs64 is in the way"):
        rl.main(argv + ["--cache_dir", str(tmp_path / "cache")])
    assert (tmp_path / "cache" / "pairs64" / "train.npz").read_bytes() == b"mine"


# ----------------------------------------------------------------------------- 2. the export
def users_hf_model(folder):
    """A reward model of the user's own, as transformers saves one."""
    folder.mkdir()
    config = dict(architectures=["LlamaForSequenceClassification"], model_type="llama")
    (folder / "config.json").write_text(json.dumps(config | dict(transformers_version="4.50")))
    (folder / "model.safetensors").write_bytes(b"their weights")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def export_cli(ckpt, out, *args):
    return cli("-m", "nanorm.score", "--ckpt", ckpt, "--export_hf", out, *args)


def test_export_refuses_a_users_own_reward_model(first_run, tmp_path, capsys):
    from nanorm import score

    theirs = users_hf_model(tmp_path / "theirs")
    before = contents(theirs)
    argv = ["--ckpt", first_run / "ckpt.pt", "--export_hf", theirs]
    refused_here(capsys, score.main, argv, theirs, "no .nanorm record", "new folder")
    assert contents(theirs) == before


@pytest.mark.slow
def test_a_new_export_replaces_the_old_one_whole(first_run, tmp_path):
    """Re-exported with a vocabulary that has no HF form, no file of the earlier export
    (its tokenizer.model) survives beside the new weights; nothing is left aside."""
    pytest.importorskip("safetensors")
    stories = shared_path("llama2c", "stories260K", "stories260K.bin")
    tok512 = shared_path("llama2c", "stories260K", "tok512.bin")
    hf = tmp_path / "hf"
    ok(export_cli(first_run / "ckpt.pt", hf))
    assert {"tokenizer.model", "config.json", MARKER} <= set(os.listdir(hf))
    ok(export_cli(stories, hf, "--tokenizer", tok512))
    assert sorted(os.listdir(hf)) == sorted([MARKER, "config.json", "model.safetensors"])
    assert json.load(open(hf / "config.json"))["vocab_size"] == 512
    assert os.listdir(tmp_path) == ["hf"]  # the old export removed, no new one left aside
    (hf / "README.md").write_text("my model card")  # the user's file in an export: refused
    refused(export_cli(stories, hf, "--tokenizer", tok512), hf, "README.md", "new folder")
    assert (hf / "README.md").read_text() == "my model card"


# ----------------------------------------------------------------------------- 3. links
@pytest.mark.slow
def test_a_link_where_a_temporary_file_was_is_never_followed(arith, first_run, tmp_path):
    """Links named as the fixed temporary files of earlier versions (ckpt.pt.tmp, ...) point
    outside the run: --resume writes none of them, and leaves them as they are."""
    run = copy_run(first_run, tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("ckpt.pt", "log.jsonl", "eval.json", "curves.png", MARKER):
        (outside / name).write_text("the user's, elsewhere")
        os.symlink(outside / name, run / f"{name}.tmp")
    ok(train_cli(arith, run, "--resume", "--max_iters", 2))
    assert all(f.read_text() == "the user's, elsewhere" for f in outside.iterdir())
    assert all(os.path.islink(run / f"{f.name}.tmp") for f in outside.iterdir())
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 2


def test_a_link_at_an_output_is_refused(arith, first_run, tmp_path, capsys):
    import eval_rm

    """A log.jsonl (or eval.json) that is a dangling link: refused in one line, nothing made
    where it points."""
    out = tmp_path / "run"
    out.mkdir()
    os.symlink(tmp_path / "made_outside.jsonl", out / "log.jsonl")
    refused_here(capsys, train_rm.main, train_argv(arith, out), out / "log.jsonl", "is a link")
    e = tmp_path / "e"
    e.mkdir()
    os.symlink(tmp_path / "made_outside.json", e / "eval.json")
    ev = ["--ckpt", first_run / "ckpt.pt", "--data", arith, "--out", e]
    refused_here(capsys, eval_rm.main, ev, e / "eval.json", "is a link", "remove it")
    assert sorted(os.listdir(tmp_path)) == ["e", "run"]


def test_writes_and_appends_never_go_through_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("kept")
    os.symlink(target, tmp_path / "link")
    with pytest.raises(UsageError, match="is a link"):
        with atomic_write(tmp_path / "link") as f:
            f.write(b"lost")
    with pytest.raises(UsageError, match="is a link"):
        append_text(tmp_path / "link", "lost")
    assert target.read_text() == "kept" and sorted(os.listdir(tmp_path)) == ["link", "target"]


# ----------------------------------------------------------------------------- 4. the lock
@pytest.mark.slow
def test_save_calibration_takes_the_runs_lock(arith, first_run, tmp_path):
    """While a run holds its folder's lock, eval_rm.py --save_calibration on its ckpt.pt is
    refused (its calibration would be measured on other weights, or dropped at the run's next
    save); once the run is over it is stored, and the lock given back."""
    run = copy_run(first_run, tmp_path / "run")
    before = (run / "ckpt.pt").read_bytes()
    ev = ["eval_rm.py", "--ckpt", run / "ckpt.pt", "--data", arith, "--out", tmp_path / "e"]
    with open(run / ".lock", "w") as held:
        held.write("4242 elsewhere\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)  # a live run
        p = cli(*ev, "--save_calibration")
        refused(p, run, "in use by another run (process 4242", "--save_calibration again")
    assert (run / "ckpt.pt").read_bytes() == before
    ok(cli(*ev, "--save_calibration"))
    assert "reward_normalization" in torch.load(run / "ckpt.pt", weights_only=True)
    assert not (run / ".lock").exists()


# ----------------------------------------------------------------------------- 5. the disk
def may_mount():
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextmanager
def tmpfs(path, size):
    """A real tmpfs of size bytes at path, unmounted at the end; a skip where none mounts."""
    path.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)  # fmt: skip
    if p.returncode:
        pytest.skip(f"no tmpfs mounts here ({p.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path, options):
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


def used(path):
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def write_pairs_jsonl(path, n):
    from data.arith.prepare import make_pair

    rng = random.Random(0)
    path.write_text("".join(json.dumps(make_pair(rng, 9)) + "\n" for _ in range(n)))
    return path


@contextmanager
def read_only_folder(path, fill):
    """A folder at path holding what fill(path) writes, then made read-only: a real read-only
    tmpfs where the test may mount one, else (not root) a folder without write permission.
    -> words of the refusal it causes."""
    if may_mount():
        with tmpfs(path, 2**26):
            fill(path)
            remount(path, "ro")
            yield ["Read-only file system", "writable"]
        return
    if os.geteuid() == 0:
        pytest.skip("no tmpfs mounts here, and root writes in a folder without permission")
    path.mkdir()
    fill(path)
    path.chmod(0o500)
    try:
        yield ["Permission denied"]
    finally:
        path.chmod(0o700)


@pytest.mark.slow
def test_a_read_only_disk_is_one_line_in_every_entry_point(arith, first_run, tmp_path):
    """train, eval, prepare and export into a read-only folder: one line naming the path and
    the fix, and the export already there kept."""
    pytest.importorskip("safetensors")
    src = write_pairs_jsonl(tmp_path / "pairs.jsonl", 40)
    export = lambda disk: ok(export_cli(first_run / "ckpt.pt", disk / "hf"))  # the user's
    with read_only_folder(tmp_path / "disk", export) as words:
        disk = tmp_path / "disk"
        before = contents(disk / "hf")
        refused(train_cli(arith, disk / "run"), disk, *words)
        ev = ["eval_rm.py", "--ckpt", first_run / "ckpt.pt", "--data", arith]
        refused(cli(*ev, "--out", disk / "e"), disk, *words)
        p = cli("data/prepare.py", "--src", src, "--tokenizer", arith / "tok.model",
                "--out_dir", disk / "d")  # fmt: skip
        refused(p, disk, *words)
        line = refused(export_cli(first_run / "ckpt.pt", disk / "hf"), disk / "hf", *words)
        assert "the previous export is kept" in line
        assert contents(disk / "hf") == before and sorted(os.listdir(disk)) == ["hf"]


@pytest.mark.slow
@pytest.mark.skipif(not may_mount(), reason="a real full disk needs a tmpfs (root and mount)")
def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_previous_files(arith, tmp_path):
    """A run's checkpoint that no longer fits (torch.save's own error is a RuntimeError from
    its zip writer), and an export of another model that does not fit beside the previous one:
    each one line, the previous file or export kept whole, nothing left aside."""
    pytest.importorskip("safetensors")
    with tmpfs(tmp_path / "disk", 2**26) as disk:
        run = disk / "run"
        train_rm.main(["--dataset", str(arith), "--out_dir", str(run), *map(str, TINY)])
        before = contents(run)
        remount(disk, f"size={used(disk) + len(before['ckpt.pt']) // 2}")
        line = refused(train_cli(arith, run, "--resume", "--max_iters", 2), run / "ckpt.pt")
        assert "No space left on device" in line and "the previous one is kept" in line
        assert contents(run)["ckpt.pt"] == before["ckpt.pt"]
        assert not [n for n in os.listdir(run) if n.endswith(".tmp")]

        remount(disk, "size=64m")
        ok(export_cli(run / "ckpt.pt", disk / "hf"))
        exported = contents(disk / "hf")
        from model import ModelConfig
        from nanorm.ckpt import save_checkpoint

        shape = torch.load(run / "ckpt.pt", weights_only=True)["config"]
        bigger = RewardModel.from_config(ModelConfig(**shape | dict(dim=96, hidden_dim=192)))
        save_checkpoint(tmp_path / "bigger.pt", bigger, meta=json.load(open(arith / "meta.json")))
        remount(disk, f"size={used(disk) + len(exported['model.safetensors']) // 2}")
        line = refused(export_cli(tmp_path / "bigger.pt", disk / "hf"), disk / "hf")
        assert "No space left on device" in line and "previous export is kept" in line
        assert contents(disk / "hf") == exported  # not its config beside the old weights
        assert sorted(os.listdir(disk)) == ["hf", "run"]


def test_torchs_wrapping_of_a_full_disk_is_found(tmp_path):
    """The stand-in where no tmpfs mounts: torch.save reports a full disk as a RuntimeError
    raised while handling the OSError; atomic_write raises that OSError, naming the file, and
    leaves the previous file and no temporary one."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"previous")
    with pytest.raises(OSError) as e:
        with atomic_write(path):
            try:
                raise OSError(28, "No space left on device")
            except OSError:
                # as torch raises it: the OSError is only its context
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # noqa: B904
    assert e.value.errno == 28 and e.value.filename == str(path)
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["ckpt.pt"]


# ----------------------------------------------------------------------------- 6. the trainer
def trainer():
    model = tiny_model(RewardModel).train()
    return train_rm.RewardModelTrainer(model, optimizer=torch.optim.AdamW(model.parameters()))


def pairs_dict(**changed):
    ids = torch.randint(3, 61, (2, 6))
    batch = dict(chosen_input_ids=ids, chosen_attention_mask=torch.ones(2, 6, dtype=torch.long))
    batch |= dict(reject_input_ids=ids.flip(1), reject_attention_mask=torch.ones(2, 6).long())
    return batch | changed


@pytest.mark.parametrize(
    "loader, words",
    [
        ([], ["holds 0 batches", "accumulation_steps=1", "give it more pairs"]),
        (
            [pairs_dict(chosen_input_ids=torch.rand(2, 6) * 60)],
            ["chosen_input_ids holds torch.float32 values, not token ids", ".long()"],
        ),
        (
            [pairs_dict(chosen_attention_mask=torch.ones(2, 5))],
            ["chosen_attention_mask has shape (2, 5), chosen_input_ids (2, 6)", "mask"],
        ),
        (
            [pairs_dict(reject_input_ids=torch.randint(3, 61, (6,)))],
            ["reject_input_ids has shape (6,)", "(pairs, tokens)"],
        ),
        (
            [pairs_dict(reject_input_ids=torch.randint(3, 61, (3, 6)))],
            ["reject_input_ids has 3 rows, chosen_input_ids 2"],
        ),
    ],
)
def test_the_trainers_inputs_are_one_line_each(loader, words):
    with pytest.raises(UsageError) as e:
        trainer().fit(loader)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# ----------------------------------------------------------------------------- 7. a bad step
def negative_step_run(first_run, to):
    run = copy_run(first_run, to)
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    torch.save(ckpt | dict(step=-3), run / "ckpt.pt")
    return run


def test_a_negative_step_never_cuts_the_log(arith, first_run, tmp_path, capsys):
    """A ckpt.pt whose step is -3 would resume at -2 and keep none of the log's rows: the log
    is cut only at a step a run can have, so the run stops first, the log whole."""
    run = negative_step_run(first_run, tmp_path / "run")
    before = contents(run)
    argv = train_argv(arith, run, "--resume")
    refused_here(capsys, train_rm.main, argv, "step is -3", "--overwrite")
    assert contents(run) == before


def test_a_negative_step_is_refused_as_the_checkpoints(arith, first_run, tmp_path, capsys):
    """The refusal names the checkpoint whose step is wrong (resume reading ckpt.pt), before
    the run builds a schedule on it."""
    run = negative_step_run(first_run, tmp_path / "run")
    argv = train_argv(arith, run, "--resume")
    refused_here(capsys, train_rm.main, argv, run / "ckpt.pt", "step")
