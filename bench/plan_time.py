"""Plan time: paper-machine-b with 4 GPUs + 8 SSDs (target < 2 s), and the real 8-GPU servers
asus-esc8000a-e12 (8 GPUs + 8 SSDs into its slots) and hgx-a100-8gpu (8 SSDs) (target < 30 s).
Baselines in the same run: one LP per symmetry-distinct candidate without the capacity classes and
the bound (measured), and brute force without any pruning, timed on a sample of the raw placements
and extrapolated to all of them (listing millions is not possible).

`--process`: the whole `moment plan --profile paper-machine-b --gpus 4 --ssds 8 --json` process
(start-up included; target < 0.8 s), the median of `--runs` fresh processes, beside the same command
from commit `--against` (default: the commit before the start-up work), with whether the JSON is the
same (search timings aside).

`--mixed`: large machines of mixed slots instead (`moment.topology.generate.mixed_chassis`: 64 slots
of widths x4-x16 and PCIe 3-5, seeds 0-4) with 2 GPUs + 4 SSDs (target: seconds) and 8 + 16
(target: well under a minute), where the listing gives way to the branch and bound; on 12-slot
ones the branch and bound against solving every listed placement (same optimum).

    .venv/bin/python bench/plan_time.py [--sample 256] [--mixed] [--process [--runs 7] [--against REF]]
"""

from __future__ import annotations

import argparse
import itertools
import time

from processes import BEFORE, compare

from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory, fits, strip
from moment.topology.profiles import builtin_names, load_profile
from moment.workload.spec import WorkloadSpec


def raw_sample(topo, inventory, n):
    """The first n raw (unpruned) placements in brute-force order (double-width rules ignored)."""
    slots = topo.empty_slots()
    models = inventory.models()

    def rec(i, chosen, free):
        if i == len(models):
            yield dict(chosen)
            return
        m, c = models[i]
        for combo in itertools.combinations([s for s in free if fits(s, m)], c):
            ids = {s.id for s in combo}
            yield from rec(i + 1, {**chosen, **{s.id: m.name for s in combo}}, [s for s in free if s.id not in ids])

    return list(itertools.islice(rec(0, {}, slots), n))


def bench(name: str, inventory: Inventory, sample: int) -> None:
    topo = load_profile(name)
    w = WorkloadSpec()
    t0 = time.perf_counter()
    plan = make_plan(topo, inventory, w, maxflow_backend="ortools")
    total = time.perf_counter() - t0
    s = plan.search
    bare, _ = strip(topo)
    cands = raw_sample(bare, inventory, sample)
    tmpl = ChassisTemplate(bare)
    t1 = time.perf_counter()
    for i in range(0, len(cands), 64):
        solve_lp_batch([tmpl.network(p, w) for p in cands[i:i + 64]])
    per_raw = (time.perf_counter() - t1) / max(len(cands), 1)
    brute = per_raw * s.raw_candidates
    from moment.planner import search

    t2 = time.perf_counter()
    distinct = search.enumerate_placements(bare, inventory).distinct
    exhaustive = []
    for i in range(0, len(distinct), 64):
        exhaustive += solve_lp_batch([tmpl.network(p, w) for p in distinct[i:i + 64]])
    every_distinct = time.perf_counter() - t2
    best_exhaustive = min(x.epoch_read_s for x in exhaustive)
    print(f"{name}.inventory: {inventory.describe()}")
    print(f"{name}.raw_candidates: {s.raw_candidates}")
    print(f"{name}.distinct_candidates: {s.distinct_candidates}")
    print(f"{name}.pruning_ratio: {s.raw_candidates / max(s.distinct_candidates, 1):.0f}")
    print(f"{name}.capacity_classes: {s.capacity_classes}")
    print(f"{name}.lps_solved: {s.solved}")
    print(f"{name}.ms_per_solve: {1e3 * s.seconds_per_solve:.3f}")
    print(f"{name}.plan_seconds_total: {total:.2f}")
    print(f"{name}.baseline_lp_every_distinct_seconds: {every_distinct:.2f}")
    print(f"{name}.speedup_vs_lp_every_distinct: {every_distinct / total:.1f}")
    print(f"{name}.same_optimum_as_lp_every_distinct: {abs(best_exhaustive - plan.predicted.epoch_read_s) <= 1e-6 * best_exhaustive}")
    print(f"{name}.baseline_brute_force_ms_per_candidate: {1e3 * per_raw:.3f}")
    print(f"{name}.baseline_brute_force_seconds_extrapolated: {brute:.0f}")
    print(f"{name}.speedup_vs_brute_force: {brute / total:.0f}")
    print(f"{name}.predicted_epoch_read_s: {plan.predicted.epoch_read_s:.3f}")
    print(f"{name}.gain_vs_best_baseline: {plan.gain_vs_best_baseline:.3f}")


def bench_mixed() -> None:
    from moment.planner import search
    from moment.planner.branch import branch_and_bound
    from moment.topology.generate import mixed_chassis

    w = WorkloadSpec()
    for seed in range(5):
        topo = mixed_chassis(64, seed=seed)
        for gpus, ssds in ((2, 4), (8, 16)):
            name = f"mixed64-seed{seed}.{gpus}+{ssds}"
            t0 = time.perf_counter()
            plan = make_plan(topo, Inventory.simple(gpus, ssds), w)
            s = plan.search
            print(f"{name}.method: {s.method}")
            print(f"{name}.raw_candidates: {s.raw_candidates}")
            print(f"{name}.nodes_bounded: {s.nodes}")
            print(f"{name}.proven_optimal: {s.proven_optimal}")
            print(f"{name}.predicted_epoch_read_s: {plan.predicted.epoch_read_s:.4f}")
            print(f"{name}.plan_seconds_total: {time.perf_counter() - t0:.2f}")
    for seed in range(4):  # small enough to solve every listed placement
        topo = mixed_chassis(12, seed=seed, root_complexes=2)
        inv = Inventory.simple(2, 3)
        tmpl = ChassisTemplate(topo)
        t0 = time.perf_counter()
        distinct = search.enumerate_placements(topo, inv).distinct
        every = min(x.epoch_read_s for i in range(0, len(distinct), 64)
                    for x in solve_lp_batch([tmpl.network(p, w) for p in distinct[i:i + 64]]))
        t1 = time.perf_counter()
        bnb = branch_and_bound(tmpl, inv, w)
        t2 = time.perf_counter()
        name = f"mixed12-seed{seed}.2+3"
        print(f"{name}.baseline_lp_every_distinct_seconds: {t1 - t0:.2f}")
        print(f"{name}.branch_and_bound_seconds: {t2 - t1:.2f}")
        print(f"{name}.same_optimum_as_lp_every_distinct: {abs(bnb.epoch_read_s - every) <= 1e-6 * every}")


def same_plan(a: str, b: str) -> bool:
    """Two `plan --json` outputs alike but for the search's own timings."""
    import json

    def strip(text: str) -> dict:
        d = json.loads(text)
        for k in ("seconds_total", "seconds_per_solve"):
            d["search"].pop(k, None)
        return d

    return strip(a) == strip(b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=256, help="raw placements timed for the brute-force baseline")
    ap.add_argument("--mixed", action="store_true", help="large machines of mixed slots (branch and bound)")
    ap.add_argument("--process", action="store_true", help="the whole moment plan process, start-up included")
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per figure (--process)")
    ap.add_argument("--against", default=BEFORE, help="commit to compare the process with (--process; '' for none)")
    args = ap.parse_args()
    if args.mixed:
        bench_mixed()
        return
    if args.process:
        compare("plan_process", ["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--json"],
                args.runs, args.against or None, target="< 0.8", same=same_plan)
        return
    bench("paper-machine-b", Inventory.simple(4, 8), args.sample)
    bench("paper-machine-a", Inventory.simple(4, 8), args.sample)
    for name, gpus in (("asus-esc8000a-e12", 8), ("hgx-a100-8gpu", 0)):
        if name in builtin_names():
            bench(name, Inventory.simple(gpus, 8), args.sample)
        else:
            print(f"{name}: not in topology_profiles/ (skipped)")


if __name__ == "__main__":
    main()
