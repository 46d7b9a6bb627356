"""bench/gpu_parity.py, the check bench/gpu_check.sh runs against the fp32 CPU reference: it
passes the CPU's own paths and fails a packed path that numbers positions wrongly, or a bf16
that rounds more than bf16. (The whole script's CPU form, `bash bench/gpu_check.sh --dry-run`,
runs in CI: about 3 minutes.)"""

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
