"""Every collective of a rank from one thread, in the same order on every rank (NCCL deadlocks otherwise, and
gloo does not care, so only a record can show it on CPU): the record's check on made-up records, and the
records of real runs: the session's 2-rank run with the peer tier (its exchange rounds are collectives) and,
in tests/test_multinode.py, two agents training a split layout (the remote tier's rounds)."""

from __future__ import annotations

import json
from pathlib import Path

from moment.runtime.collective_trace import check


def call(op: str, thread: str = "MainThread", group: list[int] | None = None) -> dict:
    return {"op": op, "group": group, "thread": thread}


def test_the_check_names_a_second_thread_and_the_first_call_out_of_order():
    ok = [call("all_reduce"), call("all_to_all_single"), call("barrier", group=[0, 1])]
    same = [call("all_reduce"), call("all_to_all_single"), call("barrier", group=[2, 3])]  # its machine's group
    assert check([ok, same]) == []
    two = [call("all_reduce"), call("all_to_all_single", thread="moment-gather_loop")]
    assert check([two, ok[:2]]) == ["rank 0 issued collectives from 2 threads (MainThread, moment-gather_loop): "
                                    "e.g. all_to_all_single on world from moment-gather_loop"]
    swapped = [call("all_to_all_single"), call("all_reduce"), call("barrier", group=[0, 1])]
    assert check([ok, swapped]) == ["rank 1's collective 1 is all_to_all_single on world, rank 0's is all_reduce "
                                    "on world (3 calls against 3)"]
    assert check([ok, ok[:2]]) == ["rank 1's collective 3 is nothing (its record ends), rank 0's is barrier on a "
                                   "group of 2 (2 calls against 3)"]


def traces(where: Path, name: str = "collectives-rank{}.json", n: int = 2) -> list[list[dict]]:
    return [json.loads((where / name.format(r)).read_text())["calls"] for r in range(n)]


def test_a_two_rank_run_with_peers_issues_every_collective_from_its_training_thread(two_rank_dir):
    runs = traces(two_rank_dir / "trace")
    assert check(runs) == []
    for calls in runs:
        ops = [c["op"] for c in calls]
        # the peer tier's rounds are there (its exchange runs on the world group, as everything else)
        assert ops.count("all_to_all_single") > 20 and "all_reduce" in ops, ops
        assert all(c["main"] for c in calls) and all(c["group"] is None for c in calls)
        # the next batch's round is started before the step: its last chunk moves while the step computes
        assert any(c["async"] for c in calls if c["op"] == "all_to_all_single")
