from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("MOMENT_FIXTURES", REPO.parent / "shared" / "fixtures"))
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def fixtures_dir() -> Path:
    """Real topology files of real servers (../shared/fixtures); never copied into the repo."""
    if not FIXTURES.is_dir():
        pytest.skip(f"real-server fixtures not found at {FIXTURES} (set MOMENT_FIXTURES)")
    return FIXTURES


def fixture_file(name: str) -> Path:
    p = FIXTURES / name
    if not p.is_file():
        pytest.skip(f"fixture {name} not found in {FIXTURES}")
    return p
