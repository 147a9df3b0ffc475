"""`advise` on an 8-slot chassis with 3 GPU models x 3 SSD models, against the same search without the
bound pruning (every inventory in the budget solved by the planner), in this one script.

The chassis: two sockets; on each, a root complex with one PCIe 5.0 x16 slot and a PCIe 4.0 x16
switch with three x16 slots (8 slots, each takes a GPU or an SSD). Prints `name: value` lines:
the pruned search's time (the target is < 30 s on a 2-core machine), the naive one's, their ratio,
the inventory counts, and whether both recommend the same inventories.

`--process`: the whole `moment advise --profile asus-esc8000a-e12 --budget 60000 --json` process (every
shipped model; target <= 10 s), the median of `--runs` fresh processes, beside the same command from
commit `--against` (default: the commit before the advise work) and with `--jobs 1` (no helper process
solving ahead, moment.cost.ahead), with whether the JSON is the same (the elapsed time aside).

    .venv/bin/python bench/advise.py [--budget 150000] [--no-naive] [--profile paper-machine-b]
    .venv/bin/python bench/advise.py --process [--runs 3] [--against REF]
"""

from __future__ import annotations

import argparse
import time

from processes import BEFORE, compare, time_command

from moment.cost import advise
from moment.cost.ahead import auto_jobs
from moment.topology.model import Topology
from moment.topology.profiles import load_profile

GPUS = ["A100-PCIe-40GB", "H100-PCIe-80GB", "L40S"]
SSDS = ["P5510", "PM1743", "990-PRO"]


def chassis() -> Topology:
    nodes: list[dict] = []
    for s in (0, 1):
        nodes += [
            {"id": f"cpu{s}", "kind": "socket", "memory_gib": 256, "memory_bandwidth_gbps": 150},
            {"id": f"rc{s}", "kind": "root_complex", "parent": f"cpu{s}"},
            {"id": f"rc{s}-x16", "kind": "slot", "parent": f"rc{s}", "width": 16, "link": {"gen": 5, "width": 16}},
            {"id": f"sw{s}", "kind": "switch", "parent": f"rc{s}", "link": {"gen": 4, "width": 16}},
        ]
        nodes += [{"id": f"sw{s}-x16{c}", "kind": "slot", "parent": f"sw{s}", "width": 16,
                   "link": {"gen": 4, "width": 16}} for c in "abc"]
    return Topology.model_validate({
        "name": "bench-8-slot", "description": "2 sockets, 2 PCIe 5.0 root slots, 2 PCIe 4.0 switches x 3 slots",
        "nodes": nodes, "links": [{"a": "cpu0", "b": "cpu1", "kind": "upi", "count": 2, "bandwidth_gbps": 20}]})


def run(budget: float, prune: bool, profile: str | None = None):
    topo = chassis() if profile is None else load_profile(profile)
    t = time.perf_counter()
    r = advise(topo, budget, models=GPUS + SSDS, prune=prune)
    return r, time.perf_counter() - t


def same_advice(now: str, then: str) -> bool:
    """Whether `advise --json` output `now` says what `then` says: every field of `then` the same but the elapsed
    time. A field `then` lacks is not compared: the baseline commit predates it (6242c0a has no `data`)."""
    import json

    a, b = json.loads(now), json.loads(then)
    return all(k in a and a[k] == b[k] for k in b if k != "elapsed_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=150_000)
    ap.add_argument("--no-naive", action="store_true", help="skip the baseline without bound pruning")
    ap.add_argument("--profile", help="a built-in profile or YAML file instead of the 8-slot chassis")
    ap.add_argument("--process", action="store_true", help="the whole moment advise process over every model")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per figure (--process)")
    ap.add_argument("--against", default=BEFORE, help="commit to compare the process with (--process; '' for none)")
    args = ap.parse_args()
    if args.process:
        cmd = ["advise", "--profile", "asus-esc8000a-e12", "--budget", "60000", "--json"]
        now = compare("advise_process", cmd, args.runs, args.against or None, target="<= 10", same=same_advice)
        alone = time_command([*cmd, "--jobs", "1"], args.runs)  # solving ahead on the other cores off
        print(f"advise_process.jobs: {auto_jobs()}")
        print(f"advise_process.one_job.wall_s: {alone.wall_s:.3f}")
        print(f"advise_process.one_job.cpu_s: {alone.cpu_s:.3f}")
        print(f"advise_process.one_job.runs_s: {', '.join(f'{r:.3f}' for r in alone.runs)}")
        print(f"advise_process.speedup_over_one_job: {alone.wall_s / now.wall_s:.2f}x")
        print(f"advise_process.same_output_as_one_job: {same_advice(now.stdout, alone.stdout)}")
        return
    r, secs = run(args.budget, prune=True, profile=args.profile)
    print(f"chassis: {r.machine}, GPU models: {', '.join(r.gpu_models)}, SSD models: {', '.join(r.ssd_models)}")
    print(f"budget_usd: {args.budget:.0f}")
    print(f"inventories_searched: {r.searched}")
    print(f"over_budget: {r.over_budget}")
    print(f"solved: {r.solved}")
    print(f"pruned_by_bound: {r.pruned}")
    print(f"advise_s: {secs:.2f}" + ("  (target < 30)" if args.profile is None else ""))
    print(f"best_throughput_per_dollar: {r.best_throughput_per_dollar.inventory}  tpc={r.best_throughput_per_dollar.tpc:.3f} samples/s/$")
    print(f"best_throughput: {r.best_throughput.inventory}  {r.best_throughput.throughput_samples_per_s:.0f} samples/s")
    if args.no_naive:
        return
    n, nsecs = run(args.budget, prune=False, profile=args.profile)
    same = ([c.inventory for c in (n.best_throughput_per_dollar, n.best_throughput, *n.runner_ups)]
            == [c.inventory for c in (r.best_throughput_per_dollar, r.best_throughput, *r.runner_ups)])
    print(f"naive_solved: {n.solved}")
    print(f"naive_s: {nsecs:.2f}")
    print(f"speedup: {nsecs / secs:.1f}x")
    print(f"same_recommendations: {same}")


if __name__ == "__main__":
    main()
