"""Shared test helpers: where the shared data lives, a skip when it is absent, one tiny model
factory and a tiny batch of preference pairs; the built-in arithmetic data and transformers'
SmolLM2 tokenizer made once per pytest run; one torch thread per pytest-xdist worker; a command
run with its memory measured. The commands other tests run as a user would go through
launcher.python (forks of a process that imported torch once)."""

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))  # tests import model, reward, ... from the project root

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n 2` (pyproject's addopts) runs two worker processes: one thread each keeps the
    # total at two, as a plain run on a 2-core CPU has; the commands and notebook kernels a test
    # starts inherit OMP_NUM_THREADS. A value set by hand is kept.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """Two lanes, one per pytest-xdist worker, each the longest tests first. --dist worksteal
    (pyproject's addopts) hands the first half of this list to one worker and the second half to
    the other; a worker that runs dry takes the back half of the other's queue. So each half is
    that worker's lane: the notebooks' runs dealt alternately (their order in test_notebooks is
    the longest first), then the other slow tests, whole files dealt to the lane with fewer,
    then quick tests filling the lane to half the list; both workers end on quick tests."""
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    quick = [i for i in items if i.get_closest_marker("slow") is None]
    notebooks = [i for i in slow if i.path.name == "test_notebooks.py"]
    lanes = [notebooks[0::2], notebooks[1::2]]
    files = {}
    for i in slow:
        if i.path.name != "test_notebooks.py":
            files.setdefault(i.path, []).append(i)
    for tests in sorted(files.values(), key=len, reverse=True):
        min(lanes, key=len).extend(tests)
    half = len(items) // 2  # what worksteal sends the first worker
    fill = max(0, half - len(lanes[0]))
    items[:] = lanes[0] + quick[:fill] + lanes[1] + quick[fill:]


MEASURED = []  # (test, what it measured): times and sizes printed after the run, never judged


def pytest_runtest_logreport(report):
    """A test's record_property("measured", text) reaches here from any xdist worker."""
    if report.when == "call":
        MEASURED.extend((report.nodeid, v) for k, v in report.user_properties if k == "measured")


def pytest_terminal_summary(terminalreporter):
    if MEASURED:
        terminalreporter.section("measured, not judged")
        for test, text in sorted(MEASURED):
            terminalreporter.write_line(f"{test.split('::')[-1]}: {text}")


@pytest.fixture(scope="session", autouse=True)
def built_in_arith(tmp_path_factory):
    """data/arith, the built-in pairs that train_rm.py, nanorm.rl and the notebooks make on first
    use, made once before any test. Under a lock: two xdist workers, or two notebooks, asking
    for it at once would otherwise both write it."""
    from filelock import FileLock  # a dependency of torch

    from data.arith.prepare import HERE, built_in

    if not os.path.exists(os.path.join(HERE, "meta.json")):
        # the folder above each worker's own basetemp is the one all workers share
        with FileLock(tmp_path_factory.getbasetemp().parent / "built_in_arith.lock"):
            built_in()  # a no-op for the worker that waited: the data is there now
    return HERE


def made_once(tmp_path_factory, name, make):
    """A folder that make(folder) fills once per pytest run, shared by the pytest-xdist
    workers (under a lock): a module's fixture would otherwise be built on each worker that
    runs one of its tests."""
    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this pytest run's
    folder = root / name
    with FileLock(root / f"{name}.lock"):
        if not (folder / ".made").exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


def smollm2_hf_tokenizers(tmp_path_factory):
    """The folder where transformers saved its reading of SmolLM2's GGUF tokenizer (hf/, 7 s
    to convert on a 2-core CPU) and a copy with SmolLM2's own pre-tokenizer (hf_smollm/):
    bench/check_bpe.py's references, made once per pytest run for every test that compares
    with them. A skip where the GGUF file or transformers is absent."""
    shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    pytest.importorskip("transformers", reason="the HF reference needs transformers")
    from bench.check_bpe import hf_references

    return made_once(tmp_path_factory, "bpe_refs", hf_references)


# a model small enough for any test: two layers, grouped-query attention, an odd vocabulary
TINY = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=61, hidden_dim=64)
TINY_MAX_LEN = 64


def tiny_hf_config(**kw):
    """transformers' LlamaConfig of a small GQA model (the parity tests' reference), any field
    overridden by kw."""
    import transformers

    base = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=101, rms_norm_eps=1e-5,
                max_position_embeddings=128)  # fmt: skip
    return transformers.LlamaConfig(**(base | kw))


def shared_path(*parts):
    """Path under ../shared/data, or skip the test with a message saying what is missing."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} absent: this test needs the shared data in ../shared/data")
    return p


def tiny_config(**kw):
    """TINY's ModelConfig, any field overridden by kw."""
    from model import ModelConfig

    return ModelConfig(**(TINY | dict(max_seq_len=TINY_MAX_LEN) | kw))


def tiny_model(cls=None, seed=0, **kw):
    """A seeded, eval-mode model of tiny_config(**kw): a Transformer (cls None), or cls built
    with cls.from_config. A scalar head gets unit-variance weights: at its init std of
    1/(dim+1) the rewards are about 0.2 and an error in them would hide below the tolerances."""
    from model import Transformer

    torch.manual_seed(seed)
    if cls is None:
        return Transformer(tiny_config(**kw)).eval()
    model = cls.from_config(tiny_config(**kw)).eval()
    with torch.no_grad():
        model.head.weight.normal_()
    return model


def pad(seqs, side="right", pad_id=0, T=None):
    """Lists of ids -> tokens (B, T) padded on `side` with pad_id, and the mask (B, T)."""
    T = T or max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), T), pad_id)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        a = T - len(s) if side == "left" else 0
        tokens[i, a : a + len(s)], mask[i, a : a + len(s)] = torch.as_tensor(s), 1
    return tokens, mask


# two pairs with different prompt and response lengths; 2 is the EOS that ends each response
PROMPTS = [[1, 5, 9], [1, 7]]
CHOSEN = [[11, 12, 13, 2], [14, 2]]
REJECTED = [[20, 2], [21, 22, 23, 24, 25, 2]]


@pytest.fixture
def pair_batch():
    """The two pairs right-padded as data/pairs.py's Batch holds them: (chosen, chosen_mask,
    rejected, rejected_mask, chosen_response_mask), 1 on the chosen response's tokens."""
    chosen, cmask = pad([p + c for p, c in zip(PROMPTS, CHOSEN, strict=True)])
    rejected, rmask = pad([p + r for p, r in zip(PROMPTS, REJECTED, strict=True)])
    response = torch.zeros_like(chosen)
    for i, (p, c) in enumerate(zip(PROMPTS, CHOSEN, strict=True)):
        response[i, len(p) : len(p) + len(c)] = 1
    return chosen, cmask, rejected, rmask, response


def stories_arith(out_dir, n_train, n_val):
    """Arithmetic pairs (data/arith's) tokenized with stories260K's own vocabulary, tok512.bin,
    prepared by data/prepare.py into out_dir: data that --init stories260K.bin accepts (the
    built-in data has a vocabulary of its own, which a checkpoint of 512 rows refuses)."""
    import json
    import random

    from data.arith.prepare import make_pair
    from data.prepare import main as prepare

    tok = shared_path("llama2c", "stories260K", "tok512.bin")
    rng = random.Random(0)
    src = Path(out_dir) / "pairs.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    rows = [make_pair(rng, 9) for _ in range(n_train + n_val)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare(
        [
            "--src",
            str(src),
            "--out_dir",
            str(Path(out_dir) / "data"),
            "--tokenizer",
            str(tok),
            "--val_frac",
            str(n_val / (n_train + n_val)),
        ]
    )
    return str(Path(out_dir) / "data")


# A small Python between the test and the command: a child forked from a pytest worker starts
# with the worker's memory high-water mark (Linux carries it through fork and exec), so the
# worker's own gigabytes would read as the command's. The command, forked from this small
# process, reports its own peak. The cap on the address space is set here and inherited.
_MEASURE = """\
import os, resource, subprocess, sys
cap, report = int(sys.argv[1]), sys.argv[2]
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
p = subprocess.Popen([sys.executable, *sys.argv[3:]])
_, status, usage = os.wait4(p.pid, 0)
with open(report, "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def run_measured(argv, cap=0, limit_s=900):
    """Run `python argv` from the project root with one torch thread, its address space capped
    at cap bytes (0: no cap), so a reader that slurps a file dies there instead of taking the
    machine's memory. Returns (exit status, stdout, stderr, the command's own peak resident
    bytes, seconds). limit_s only stops a hang; no test decides by the time."""
    import subprocess
    import tempfile
    import threading
    import time

    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as d:
        report, out, err = (Path(d) / n for n in ("report", "out", "err"))
        with open(out, "wb") as o, open(err, "wb") as e:
            t0 = time.monotonic()
            p = subprocess.Popen([sys.executable, "-c", _MEASURE, str(cap), str(report),
                                  *map(str, argv)], cwd=ROOT, env=env, stdout=o, stderr=e)  # fmt: skip
            hang = threading.Timer(limit_s, p.kill)
            hang.start()
            p.wait()
            hang.cancel()
            seconds = time.monotonic() - t0
        rc, maxrss = map(int, report.read_text().split())
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        said = (f.read_text(errors="replace") for f in (out, err))
        return rc, *said, maxrss * scale, seconds
