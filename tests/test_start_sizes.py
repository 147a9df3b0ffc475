"""A fresh rank's and agent's start-up sizes are measured once per installation and kept (moment.runtime
.start_sizes): what is kept is what was measured, a change of code or release measures again, and a
cache that is corrupt, missing or unwritable never stops a run."""

from __future__ import annotations

import json

import pytest

from moment.runtime import start_sizes as ss


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The measurement replaced by a counter (the real one imports torch in a subprocess: covered by
    tests/test_train.py::test_a_rank_base_includes_the_model_layers); the cache under tmp_path."""
    calls = []

    def measure():
        calls.append(1)
        return 100 + len(calls), 200 + len(calls)

    monkeypatch.setenv("MOMENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ss.NO_CACHE_ENV, raising=False)
    monkeypatch.setattr(ss, "_measure", measure)
    ss.fresh_sizes.cache_clear()
    yield calls
    ss.fresh_sizes.cache_clear()


def test_measured_once_then_read_from_the_cache(measured):
    assert (ss.agent_start_bytes(), ss.rank_start_bytes()) == (101, 201)
    f = ss.cache_file(ss.cache_key())
    assert json.loads(f.read_text()) == {"agent_bytes": 101, "rank_bytes": 201}
    ss.fresh_sizes.cache_clear()  # a new process
    assert ss.fresh_sizes() == (101, 201) and len(measured) == 1


@pytest.mark.parametrize("content", ["", "{not json", '{"agent_bytes": 5}', '{"agent_bytes": 0, "rank_bytes": 3}'])
def test_a_corrupt_cache_is_measured_again_and_rewritten(measured, content):
    f = ss.cache_file(ss.cache_key())
    f.parent.mkdir(parents=True)
    f.write_text(content)
    assert ss.fresh_sizes() == (101, 201) and len(measured) == 1
    assert json.loads(f.read_text()) == {"agent_bytes": 101, "rank_bytes": 201}


def test_an_unwritable_cache_still_gives_the_sizes(measured, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MOMENT_CACHE", str(blocker / "under-a-file"))
    assert ss.fresh_sizes() == (101, 201)
    ss.fresh_sizes.cache_clear()
    assert ss.fresh_sizes() == (102, 202)  # nothing kept: measured again


def test_asked_to_measure_every_time(measured, monkeypatch):
    monkeypatch.setenv(ss.NO_CACHE_ENV, "1")
    ss.fresh_sizes()
    ss.fresh_sizes.cache_clear()
    assert ss.fresh_sizes() == (102, 202) and not (ss.cache_root() / "start-sizes").exists()


def test_the_key_follows_moments_code_and_the_releases(monkeypatch, tmp_path):
    pkg = tmp_path / "moment"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "train.py").write_text("A = 1\n")
    monkeypatch.setattr(ss, "_moment_root", lambda: pkg)
    k = ss.cache_key()
    assert ss.cache_key() == k
    (pkg / "runtime" / "train.py").write_text("A = 2\n")
    assert ss.cache_key() != k
    k2 = ss.cache_key()
    (pkg / "runtime" / "new.py").write_text("")
    assert ss.cache_key() != k2
    k3 = ss.cache_key()
    real = ss.metadata.version
    monkeypatch.setattr(ss.metadata, "version", lambda d: "0.0.0" if d == "torch" else real(d))
    assert ss.cache_key() != k3
