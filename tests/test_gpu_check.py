"""bench/gpu_parity.py, the check bench/gpu_check.sh runs against the fp32 CPU reference: it
passes the CPU's own paths and fails a packed path that numbers positions wrongly, or a bf16
that rounds more than bf16. (The whole script's CPU form, `bash bench/gpu_check.sh --dry-run`,
runs in CI: about 3 minutes.)"""

import os
import subprocess
import sys

import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_parity  # noqa: E402

SMALL = ["--device", "cpu", "--pairs", "6", "--dim", "64", "--layers", "2"]


def test_the_cpu_paths_pass(capsys):
    assert gpu_parity.main(SMALL) == 0
    out = capsys.readouterr().out
    assert out.count("PASS cpu") == 4 and "FAIL" not in out


def test_a_packed_path_off_by_one_position_fails(capsys, monkeypatch):
    pack = gpu_parity.pack_pairs

    def shifted(items, pad_id):  # the rejected response numbered from the prompt's end - 1
        b = pack(items, pad_id)
        b.positions = torch.where(b.segments == 2, b.positions - 1, b.positions)
        return b

    monkeypatch.setattr(gpu_parity, "pack_pairs", shifted)
    assert gpu_parity.main(SMALL) == 1
    out = capsys.readouterr().out
    assert "PASS cpu float32 padded rows" in out and "FAIL cpu float32 packed" in out


def test_rounding_past_bf16s_fails(capsys, monkeypatch):
    score = gpu_parity.RewardModel.score

    def coarse(self, h):  # rewards rounded to 4 bits of mantissa under autocast only
        r = score(self, h)
        if not torch.is_autocast_enabled("cpu"):
            return r
        m, e = torch.frexp(r)
        return torch.ldexp(torch.round(m * 16) / 16, e)

    monkeypatch.setattr(gpu_parity.RewardModel, "score", coarse)
    assert gpu_parity.main(SMALL) == 1
    out = capsys.readouterr().out
    assert "PASS cpu float32 packed" in out and "FAIL cpu bfloat16 padded rows" in out


def test_the_script_runs_the_steps_named_and_refuses_others(tmp_path):
    """`bash bench/gpu_check.sh --dry-run parity` runs that step alone; an unknown name is a
    usage error (exit 2) before anything runs. The script's python is a stand-in here that
    records its arguments (CI runs the real dry run)."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = str(ROOT / "bench" / "gpu_check.sh")
    p = subprocess.run(
        ["bash", script, "--dry-run", "parity"], env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = p.stdout.split("===== summary")[1]
    assert "PASS  parity" in summary and len(summary.strip().splitlines()) == 2, summary
    assert sorted(os.listdir(out)) == ["parity.log"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["-", "bench/gpu_parity.py --device cpu --pairs 4 --dim 64 --layers 2"], calls
    p = subprocess.run(
        ["bash", script, "--dry-run", "pariti"], env=env, capture_output=True, text=True
    )
    assert p.returncode == 2 and "usage: bash bench/gpu_check.sh" in p.stderr
    assert sorted(os.listdir(out)) == ["parity.log"]  # nothing more written
