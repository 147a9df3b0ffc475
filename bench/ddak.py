"""DDAK placement time at 1M / 10M / 100M nodes against the hash baseline, and target tracking.

Hotness: Zipf-like access counts, count(rank r) = floor(1e5 * r^-s) + U{0..3}, s = 1.0, randomly
permuted over node ids. Times exclude generating the hotness and the stable descending sort (reported
on its own as `sort_s`: moment's stable descending order, a 16-bit radix sort for integer counts); both policies get the same precomputed order. Prints `name: value` lines.

    .venv/bin/python bench/ddak.py [--sizes 1e6,1e7,1e8] [--numpy]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from moment.placement import Bin, BinSet, ddak, hash_placement, placement_report
from moment.placement._native import ddak_kernel
from moment.placement.assignment import hotness_order


def zipf_counts(n: int, s: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = np.floor(1e5 * np.arange(1, n + 1, dtype=np.float64) ** -s) + rng.integers(0, 4, n)
    out = np.empty(n)
    out[rng.permutation(n)] = h
    return out


def toy_bins(h: np.ndarray, ssd_skew: float = 1.5) -> BinSet:
    """4 GPUs / 2 CPUs / 8 SSDs on two sockets; cache targets = what their size serves; socket-0 SSDs
    get `ssd_skew` times the share of socket-1 SSDs (wider links in the plan)."""
    n = h.shape[0]
    hs = -np.sort(-h)
    gr, cr = n // 400, n // 100
    g = hs[: 4 * gr].sum() / hs.sum()
    c = hs[4 * gr : 4 * gr + 2 * cr].sum() / hs.sum()
    rest = 1 - g - c
    w = [ssd_skew] * 4 + [1.0] * 4
    bins = [Bin(name=f"gpu{i}", kind="gpu", capacity_rows=gr, target_share=g / 4, socket=f"socket{i // 2}")
            for i in range(4)]
    bins += [Bin(name=f"cpu{i}", kind="cpu", capacity_rows=cr, target_share=c / 2, socket=f"socket{i}")
             for i in range(2)]
    bins += [Bin(name=f"ssd{i}", kind="ssd", capacity_rows=n // 4, target_share=rest * w[i] / sum(w),
                 socket=f"socket{i // 4}") for i in range(8)]
    return BinSet(bins=bins)


def timed(f, *a, **kw):
    t = time.perf_counter()
    r = f(*a, **kw)
    return r, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--numpy", action="store_true", help="also time the NumPy block engine")
    ap.add_argument("--s", type=float, default=1.0)
    args = ap.parse_args()
    print(f"native_kernel: {'yes' if ddak_kernel() is not None else 'no (numpy engine)'}")
    for n in (int(float(x)) for x in args.sizes.split(",")):
        tag = f"{n // 1_000_000}M"
        h = zipf_counts(n, args.s)
        order, t_sort = timed(hotness_order, h)
        bins = toy_bins(h)
        a, t_ddak = timed(ddak, h, bins, 100, order=order)
        _, t_hash = timed(hash_placement, h, bins, order=order)
        print(f"sort_s[{tag}]: {t_sort:.2f}")
        print(f"ddak_{a.engine}_s[{tag}]: {t_ddak:.2f}")
        if args.numpy:
            b, t_np = timed(ddak, h, bins, 100, order=order, engine="numpy")
            assert np.array_equal(a.bin_of, b.bin_of)
            print(f"ddak_numpy_s[{tag}]: {t_np:.2f}")
        print(f"hash_s[{tag}]: {t_hash:.2f}")
        print(f"ddak_over_hash_time[{tag}]: {t_ddak / t_hash:.2f}")
        print(f"ddak_plus_sort_s[{tag}]: {t_ddak + t_sort:.2f}")
        del h, order, a

    # target tracking on the toy 4 GPU / 2 CPU / 8 SSD machine
    for s in (0.8, 1.0):
        h = zipf_counts(1_000_000, s, seed=1)
        bins = toy_bins(h)
        pols = {"ddak_pool1": ddak(h, bins, 1), "ddak_pool100": ddak(h, bins, 100),
                "hash": hash_placement(h, bins)}
        rep = placement_report(pols, row_stride=4096)
        for name, p in rep.policies.items():
            errs = " ".join(f"{b.name}={b.rel_error:.3f}" for b in p.bins)
            print(f"rel_error[s={s},{name}]: {errs}")
            print(f"l1_error[s={s},{name}]: {p.l1_error:.4f}")
            ssd = [b.rel_error for b in p.bins if b.kind == "ssd"]
            print(f"max_ssd_rel_error[s={s},{name}]: {max(ssd):.4f}")
        hl1 = rep.policies["hash"].l1_error
        for k in ("ddak_pool1", "ddak_pool100"):
            print(f"l1_error_ratio_hash_over_{k}[s={s}]: {hl1 / rep.policies[k].l1_error:.2f}")


if __name__ == "__main__":
    main()
