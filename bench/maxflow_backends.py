"""Max-flow backends (networkx preflow-push vs OR-Tools SimpleMaxFlow) and the LP, on every built-in
profile: the same placements (the machine as described, plus the baselines on its emptied chassis)
solved by each. Prints `name: value` lines; networkx is the baseline of the speed ratio.

    .venv/bin/python bench/maxflow_backends.py
"""

from __future__ import annotations

import time

from moment.planner.baselines import baseline_placements
from moment.planner.lp import solve_lp
from moment.planner.maxflow import solve_maxflow
from moment.planner.network import build_network
from moment.topology.devices import Inventory, populate, strip
from moment.topology.model import Kind
from moment.topology.profiles import builtin_names, load_profile
from moment.workload.spec import WorkloadSpec


def cases(topo):
    out = [(topo, {})] if topo.of_kind(Kind.gpu) and topo.of_kind(Kind.ssd) else []
    bare, _ = strip(topo)
    free = bare.empty_slots()
    inv = Inventory.simple(min(4, sum(Kind.gpu in s.accepts and s.width >= 16 for s in free)),
                           min(8, sum(Kind.ssd in s.accepts for s in free)))
    if bare.of_kind(Kind.gpu) or inv.count(Kind.gpu):
        out += [(bare, b.placement) for b in baseline_placements(bare, inv)]
    return out


def timed(fn, *args, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return out, best


def main() -> None:
    w = WorkloadSpec()
    for name in builtin_names():
        nets = [build_network(populate(t, p), w) for t, p in cases(load_profile(name))]
        if not nets:
            print(f"{name}.placements: 0 (skipped: no GPU)")
            continue
        t_nx = t_or = t_lp = 0.0
        worst = lp_over = 0.0
        for net in nets:
            a, s_nx = timed(solve_maxflow, net, "networkx")
            b, s_or = timed(solve_maxflow, net, "ortools")
            c, s_lp = timed(solve_lp, net)
            t_nx, t_or, t_lp = t_nx + s_nx, t_or + s_or, t_lp + s_lp
            worst = max(worst, abs(a.epoch_read_s - b.epoch_read_s) / a.epoch_read_s)
            lp_over = max(lp_over, c.epoch_read_s / min(a.epoch_read_s, b.epoch_read_s) - 1)
        n = len(nets)
        print(f"{name}.placements: {n}")
        print(f"{name}.edges_mean: {sum(len(x.edges) for x in nets) / n:.1f}")
        print(f"{name}.maxflow_max_rel_diff_networkx_vs_ortools: {worst:.2e}")
        print(f"{name}.maxflow_networkx_ms_per_solve: {1e3 * t_nx / n:.2f}")
        print(f"{name}.maxflow_ortools_ms_per_solve: {1e3 * t_or / n:.2f}")
        print(f"{name}.speed_ratio_networkx_over_ortools: {t_nx / t_or:.1f}")
        print(f"{name}.lp_ms_per_solve: {1e3 * t_lp / n:.2f}")
        print(f"{name}.lp_max_excess_over_maxflow: {lp_over:.3f}")


if __name__ == "__main__":
    main()
