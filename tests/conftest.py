from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# The suite draws the same examples on every run (a CI failure reproduces here); a wider random search
# is `HYPOTHESIS_PROFILE=fuzz`, with each test's own example count.
settings.register_profile("moment", derandomize=True, database=None)
settings.register_profile("fuzz", derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "moment"))

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
