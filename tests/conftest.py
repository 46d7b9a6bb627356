"""Shared test helpers: where the shared data lives, and a skip when it is absent."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))  # tests import model, reward, ... from the project root


def shared_path(*parts):
    """Path under ../shared/data, or skip the test with a message saying what is missing."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} absent: this test needs the shared data in ../shared/data")
    return p
