"""moment.cost.ahead: the advisor's search with helper processes solving ahead gives the answer it gives alone,
whatever the helpers do (answer, fail, die); `moment advise --jobs`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from moment.cli import main
from moment.cost import advise, ahead
from moment.topology.model import Topology
from test_cost import MODELS, SMALL

TESTS = str(Path(__file__).resolve().parent)


def squares(setup: dict):
    """A helper's solver (imported by name in the helper): the square of the item, after `setup['sleep']`
    seconds, raising for the keys in `setup['fail']`."""

    def solve(item: int, key: str) -> int:
        time.sleep(setup["sleep"])
        if key in setup["fail"]:
            raise ValueError(f"cannot solve {key}")
        return item * item

    return solve


@pytest.fixture
def importable(monkeypatch):
    """The helpers import this module's `squares` by name: put tests/ on their path (and helpers start at once,
    on any number of cores)."""
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setattr(ahead, "START_AFTER_S", 0.0)
    monkeypatch.setattr(ahead, "_cores", lambda: 2)


def _run(jobs: int, setup: dict, n: int = 24, kill: bool = False) -> tuple[list[int], ahead.Ahead]:
    """Ask for keys 0..n-1 in order, the next ones always named as upcoming, as the advisor's search does; the
    helpers start after the first and are waited for (their interpreters' start is not what is tested)."""
    here = squares({**setup, "fail": ()})
    got: list[int] = []
    with ahead.Ahead(here, jobs, squares, setup) as a:
        a.upcoming = lambda: ((str(k), k) for k in range(len(got) + 1, n))
        for k in range(n):
            got.append(a.solve(k, str(k)))
            while k == 0 and a._helpers and not all(h.ready or not h.alive for h in a._helpers):
                a._collect(block=True)  # (started after the first solve: let them load before the rest)
            if kill and k == 6:
                for h in a._helpers:
                    h.proc.kill()
    return got, a


def test_answers_come_from_the_helpers_and_equal_solving_alone(importable):
    got, a = _run(2, {"sleep": 0.05, "fail": ()})
    assert got == [k * k for k in range(24)]
    assert a.from_helpers >= 4, a.from_helpers  # the helper did take part
    assert a._helpers == []  # closed: no helper outlives the search


def test_no_more_processes_than_cores(monkeypatch):
    monkeypatch.setattr(ahead, "_cores", lambda: 3)
    assert ahead.Ahead(abs, 1000, squares, {})._wanted == 2 and ahead.Ahead(abs, 1, squares, {})._wanted == 0
    assert ahead.auto_jobs() == 3
    monkeypatch.setattr(ahead, "_cores", lambda: 16)
    assert ahead.auto_jobs() == ahead.MAX_AUTO_JOBS


def test_what_a_helper_fails_to_solve_is_solved_here(importable):
    """A helper that raises hands its key back: this process solves it."""
    got, a = _run(2, {"sleep": 0.05, "fail": [str(k) for k in range(24)]})
    assert got == [k * k for k in range(24)] and a.from_helpers == 0


def test_a_helper_that_dies_leaves_the_answers_whole(importable):
    got, _ = _run(2, {"sleep": 0.05, "fail": ()}, kill=True)
    assert got == [k * k for k in range(24)]


def test_one_job_starts_no_helper(importable):
    got, a = _run(1, {"sleep": 0.0, "fail": ()})
    assert got == [k * k for k in range(24)] and a.from_helpers == 0


def test_the_advice_is_the_same_with_helpers(monkeypatch):
    """The advisor's search on the 5-slot chassis: the same advice with helpers as alone, for the pruned search
    and for the baseline that solves every inventory. So that the helpers take part in so short a search, they
    start at once and this process, once it has started them, waits for them to be ready and solves slower."""
    from moment.cost import advisor

    monkeypatch.setattr(ahead, "START_AFTER_S", 0.0)
    monkeypatch.setattr(ahead, "_cores", lambda: 2)
    made: list[ahead.Ahead] = []
    monkeypatch.setattr(ahead.Ahead, "__enter__", lambda self: made.append(self) or self)
    plan = advisor._plan_inventory

    def slow_here(*args):
        a = made[-1]
        while a._helpers and not all(h.ready for h in a._helpers):
            a._collect(block=True)
        if a._helpers:
            time.sleep(0.05)
        return plan(*args)

    small = Topology.model_validate(SMALL)
    for prune in (True, False):
        alone = advise(small, 40_000, models=MODELS, top_k=2, prune=prune, jobs=1)
        with monkeypatch.context() as m:
            m.setattr(advisor, "_plan_inventory", slow_here)
            helped = advise(small, 40_000, models=MODELS, top_k=2, prune=prune, jobs=2)
        assert alone.model_dump(exclude={"elapsed_s"}) == helped.model_dump(exclude={"elapsed_s"})
        assert made[-2].from_helpers == 0 and made[-1].from_helpers > 0, prune


def test_cli_jobs(capsys, tmp_path):
    import yaml

    f = tmp_path / "small.yaml"
    f.write_text(yaml.safe_dump(SMALL))
    assert main(["advise", "-p", str(f), "--budget", "40000", "--models", "T4,P5510", "--jobs", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--jobs -1: give a number of processes, or 0 for one per core (up to 4)" in err and "Traceback" not in err
    assert main(["advise", "-p", str(f), "--budget", "40000", "--models", "T4,P5510", "--jobs", "2", "--json"]) == 0
    assert ahead.auto_jobs() >= 1
