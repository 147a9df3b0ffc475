"""Cache policies: Belady equals a brute-force optimum, every policy keeps its invariants, SlotMap."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from moment.caching import POLICIES, SlotMap, make_policy


def brute_force_min_misses(batches: list[np.ndarray], capacity: int, initial: frozenset) -> int:
    """Exhaustive: after each batch choose any subset of (cache ∪ batch) of size <= capacity."""

    @functools.cache
    def best(t: int, cache: frozenset) -> int:
        if t == len(batches):
            return 0
        b = set(batches[t].tolist())
        misses = len(b - cache)
        pool = sorted(cache | b)
        out = None
        for k in range(min(capacity, len(pool)) + 1):
            for keep in itertools.combinations(pool, k):
                v = best(t + 1, frozenset(keep))
                out = v if out is None else min(out, v)
        return misses + out

    return best(0, initial)


def run(policy, batches, plan_all: bool, superbatch: int | None = None) -> int:
    misses = 0
    for t, b in enumerate(batches):
        if plan_all and t == 0:
            policy.plan(batches)
        elif superbatch and t % superbatch == 0:
            policy.plan(batches[t:t + superbatch])
        before = set(policy.contents().tolist())
        d = policy.access(b)
        assert d.hit.tolist() == [x in before for x in b.tolist()]
        assert set(d.admit.tolist()) <= set(b[~d.hit].tolist())
        after = set(policy.contents().tolist())
        assert after == (before - set(d.evict.tolist())) | set(d.admit.tolist())
        assert len(after) <= policy.capacity
        misses += int((~d.hit).sum())
    return misses


@pytest.mark.parametrize("seed", range(25))
def test_belady_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    n, cap = 6, int(rng.integers(1, 4))
    batches = [rng.choice(n, size=int(rng.integers(1, 4)), replace=False) for _ in range(5)]
    hot = rng.integers(0, 10, n)
    opt_policy = make_policy("belady", cap, n, hotness=hot)
    initial = frozenset(opt_policy.contents().tolist())
    opt = brute_force_min_misses(batches, cap, initial)
    assert run(opt_policy, batches, plan_all=True) == opt
    for name in POLICIES:
        p = make_policy(name, cap, n, hotness=hot)
        assert run(p, batches, plan_all=name == "belady", superbatch=2) >= opt, name


def test_superbatch_of_the_whole_trace_is_belady():
    rng = np.random.default_rng(1)
    batches = [rng.choice(200, size=40, replace=False) for _ in range(20)]
    a, b = make_policy("belady", 30, 200), make_policy("belady-superbatch", 30, 200)
    assert run(a, batches, True) == run(b, batches, False, superbatch=20)


def test_static_never_changes_and_lru_matches_a_reference():
    rng = np.random.default_rng(2)
    hot = rng.integers(0, 100, 50)
    batches = [rng.choice(50, size=8, replace=False) for _ in range(30)]
    s = make_policy("static", 10, 50, hotness=hot)
    first = s.contents().copy()
    run(s, batches, False)
    assert (s.contents() == first).all() and not s.changes
    assert set(first.tolist()) == set(np.argsort(-hot, kind="stable")[:10].tolist())
    lru = make_policy("lru", 10, 50, hotness=hot)
    # reference: ordered dict of last use; warm start hottest = most recent
    last = {int(v): -2 - i for i, v in enumerate(np.argsort(-hot, kind="stable")[:10])}
    for t, b in enumerate(batches, start=1):
        d = lru.access(b)
        assert d.hit.tolist() == [int(x) in last for x in b]
        for x in b:
            last[int(x)] = t
        while len(last) > 10:
            victim = min(last, key=lambda v: (last[v], v))
            del last[victim]
        assert set(lru.contents().tolist()) == set(last)


def test_slot_map_follows_the_policy():
    rng = np.random.default_rng(3)
    p = make_policy("lru", 16, 100)
    sm = SlotMap(16, 100)
    sm.fill(p.members)
    for _ in range(40):
        d = p.access(rng.choice(100, size=12, replace=False))
        sm.apply(d)
        cached = p.contents()
        slots = sm.lookup(cached)
        assert (slots >= 0).all() and len(set(slots.tolist())) == len(cached)
        assert (sm.slot >= 0).sum() == len(cached)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_given_its_first_rows_starts_with_them_and_without_them_with_the_hottest(name):
    """The CPU tier knows its first rows (the hottest not served by a GPU tier) and hands them over, so the policy
    does not sort every node's rank for a start it would replace; the rows a policy starts with are the same."""
    rank = np.random.default_rng(3).permutation(1000)
    hottest = make_policy(name, 50, 1000, rank=rank)
    assert sorted(hottest.members.tolist()) == sorted(np.argsort(rank)[:50].tolist())
    given = np.arange(900, 950)  # not the hottest: what the caller says wins
    p = make_policy(name, 50, 1000, rank=rank, initial=given)
    assert p.members.tolist() == given.tolist() and p.cached.sum() == 50 and p.cached[given].all()
