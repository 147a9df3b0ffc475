"""Tier routing alone (moment.caching.tiers): no files, threads or torch."""

from __future__ import annotations

import numpy as np

from moment.caching import SlotMap, make_policy
from moment.caching.tiers import FixedSlots, TierRouter, no_gpu, slots_for

N = 100


def gpu_first_ten(ids: np.ndarray):
    mask = ids < 10
    return mask, ids[mask] * 2  # their rows in the GPU tier: any mapping the store defines


def test_static_cache_routes_gpu_then_cache_then_misses():
    rank = np.arange(N)  # node v is the v-th hottest
    policy = make_policy("static", 20, N, rank=rank)
    cached = np.arange(10, 30)  # the store fills the cache with the hottest rows not on the GPU
    policy.reset(cached)
    router = TierRouter(policy, FixedSlots(cached, N), gpu_first_ten)
    (r,) = router.route([np.array([50, 3, 15, 29, 7, 99])])
    assert r.gpu_pos.tolist() == [1, 4] and r.gpu_idx.tolist() == [6, 14]
    assert r.hit_pos.tolist() == [2, 3] and r.hit_slot.tolist() == [5, 19]
    assert r.miss_pos.tolist() == [0, 5] and r.admit_pos is None


def test_lru_admits_misses_into_free_slots_and_hits_them_next_batch():
    policy = make_policy("lru", 4, N, rank=np.arange(N))
    policy.reset(np.arange(4))
    slots = SlotMap(4, N)
    slots.fill(np.arange(4))
    router = TierRouter(policy, slots)
    first, second = router.route([np.array([1, 60, 61, 60]), np.array([60, 61, 2])])
    assert first.hit_pos.tolist() == [0] and first.miss_pos.tolist() == [1, 2, 3]
    assert first.admit_pos is not None and sorted(first.admit_pos.tolist()) == [1, 2]  # 60 once, 61
    assert sorted(second.hit_pos.tolist()) == [0, 1]  # both admitted rows are hits now
    assert set(slots.lookup(np.array([60, 61])).tolist()) == set(first.admit_slot.tolist())


def test_every_position_is_served_exactly_once():
    rng = np.random.default_rng(0)
    for name in ("static", "lru", "belady-superbatch"):
        policy = make_policy(name, 25, N, rank=rng.permutation(N))
        init = np.arange(25)
        policy.reset(init)
        slots = slots_for(policy, init, N)
        router = TierRouter(policy, slots, gpu_first_ten)
        batches = [rng.integers(0, N, 40) for _ in range(4)]
        for ids, r in zip(batches, router.route(batches), strict=True):
            pos = np.concatenate([r.gpu_pos, r.hit_pos, r.miss_pos])
            assert sorted(pos.tolist()) == list(range(ids.shape[0])), name
            assert (ids[r.gpu_pos] < 10).all()


def test_without_a_gpu_tier_nothing_is_routed_there():
    mask, idx = no_gpu(np.arange(5))
    assert not mask.any() and idx.size == 0


def test_peer_rows_are_routed_after_own_gpu_and_before_the_cpu_cache():
    """A fake node: this rank's GPU holds 0..9, peer 1 holds 10..19, peer 2 holds 20..24 (disjoint bins);
    the CPU cache holds the next hottest rows, 25..39. Every position goes to exactly one tier."""
    from moment.caching.tiers import no_peers

    def peers(ids):
        mask = (ids >= 10) & (ids < 25)
        on = ids[mask]
        return mask, np.where(on < 20, 1, 2), np.where(on < 20, on - 10, on - 20)

    rng = np.random.default_rng(3)
    for name in ("static", "lru", "belady-superbatch"):
        policy = make_policy(name, 15, N, rank=np.arange(N))
        init = np.arange(25, 40)
        policy.reset(init)
        slots = slots_for(policy, init, N)
        router = TierRouter(policy, slots, gpu_first_ten, peers)
        batches = [np.array([3, 12, 24, 30, 99, 20, 7, 19]), *(rng.integers(0, N, 50) for _ in range(3))]
        routes = router.route(batches)
        first = routes[0]
        assert first.gpu_pos.tolist() == [0, 6] and first.gpu_idx.tolist() == [6, 14]
        assert first.peer_pos.tolist() == [1, 2, 5, 7]
        assert first.peer_owner.tolist() == [1, 2, 2, 1] and first.peer_idx.tolist() == [2, 4, 0, 9]
        assert first.hit_pos.tolist() == [3] and first.miss_pos.tolist() == [4]
        for ids, r in zip(batches, routes, strict=True):
            pos = np.concatenate([r.gpu_pos, r.peer_pos, r.hit_pos, r.miss_pos])
            assert sorted(pos.tolist()) == list(range(ids.shape[0])), name  # no row in two tiers
            assert (ids[r.gpu_pos] < 10).all() and ((ids[r.peer_pos] >= 10) & (ids[r.peer_pos] < 25)).all()
            assert not ((ids[r.miss_pos] < 25).any()), name  # a GPU-held row is never read nor admitted
            if r.admit_pos is not None:
                assert (ids[r.admit_pos] >= 25).all()
    mask, owner, idx = no_peers(np.arange(5))
    assert not mask.any() and owner.size == 0 and idx.size == 0


def test_fixed_slots_give_each_cached_id_the_slot_a_node_sized_map_gives():
    """The rank structure against the plain map, on node counts off and on a 64-node word, caches from one row
    to every node (the last node included), filled in a shuffled order."""
    rng = np.random.default_rng(7)
    for n in (1, 63, 64, 65, 1000, 4099):
        for cap in sorted({1, n // 3 + 1, n}):
            initial = rng.permutation(n)[:cap]
            fixed, plain = FixedSlots(initial, n), SlotMap(cap, n)
            plain.fill(initial)
            ids = np.concatenate([initial, rng.choice(initial, 3 * cap)])
            assert fixed.lookup(ids).tolist() == plain.lookup(ids).tolist(), (n, cap)
            assert fixed.lookup(ids).dtype == np.int64
            assert fixed.memory_bytes() == FixedSlots.state_bytes(n, cap)
