"""A calibration carried across the paper's two machines: fitted on one machine's measured layouts,
applied to the other's (Moment (SC'25), figures 1, 2 and 7).

Fits on `tests/data/paper-machine-a-measured.yaml` (layouts a-d, data even) and on
`paper-machine-b-measured.yaml` (a-d even, paper-moment planned), prints each fit with its residuals
and leave-one-out errors, then each calibration applied to the other machine: every layout's
predicted and measured time, its time over the machine's fastest (predicted vs measured), and the
pairs predicted in the wrong order (`moment.planner.crosscheck`). Exit 0 only when both directions
pass and both leave-one-out errors are within 15%.

    .venv/bin/python bench/cross_machine.py [--fit switch_uplink,socket_link]

Deterministic (no random input); a few seconds per fit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moment.errors import MomentError
from moment.planner.calibration import calibrate, check_fit_names, load_measurements
from moment.planner.crosscheck import CROSS_FIT, RANK_MARGIN, RATIO_TOLERANCE, cross_check
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
FIT = ",".join(CROSS_FIT)
LOO_LIMIT = 0.15


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default=FIT, help=f"parameters to fit (default {FIT})")
    args = ap.parse_args()
    try:
        return run(check_fit_names([x.strip() for x in args.fit.split(",") if x.strip()]))
    except MomentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(names: list[str]) -> int:
    inv = Inventory.simple(4, 8, "A100-PCIe-40GB", "P5510")
    machines = {k: (load_profile(f"paper-machine-{k}"), load_measurements(DATA / f"paper-machine-{k}-measured.yaml"))
                for k in "ab"}
    cals, ok = {}, True
    for k, (topo, mf) in machines.items():
        cal = cals[k] = calibrate(topo, inv, mf, names)
        print(f"fit on {topo.name}: " + ", ".join(f"{n} = {cal.params[n]:.3f}" for n in names))
        print(f"  {'layout':14} {'data':8} {'measured s':>10} {'fitted s':>9} {'error':>7} {'LOO error':>9}")
        for r, m in zip(cal.residuals, mf.measurements):
            print(f"  {r.layout:14} {m.data or mf.data:8} {r.measured_s:10.2f} {r.predicted_s:9.2f} "
                  f"{r.rel_err:+7.1%} {r.loo_rel_err:+9.1%}")
        print(f"  largest leave-one-out error: {cal.loo_max_rel_err:.1%} (limit {LOO_LIMIT:.0%})")
        ok &= cal.loo_max_rel_err <= LOO_LIMIT
    for src, dst in (("a", "b"), ("b", "a")):
        topo, mf = machines[dst]
        cc = cross_check(cals[src], topo, inv, mf)
        print(f"\nfitted on {cc.fitted_on}, applied to {cc.applied_to}")
        print(f"  {'layout':14} {'data':8} {'measured s':>10} {'predicted s':>11} {'measured /fastest':>17} "
              f"{'predicted /fastest':>18} {'ratio error':>11}")
        for r in cc.rows:
            print(f"  {r.layout:14} {r.data:8} {r.measured_s:10.2f} {r.predicted_s:11.2f} {r.measured_ratio:17.3f} "
                  f"{r.predicted_ratio:18.3f} {r.ratio_err:+11.1%}")
        print(f"  pairs apart by more than {RANK_MARGIN:.0%} ranked wrong: "
              + (", ".join(f"{a} vs {b}" for a, b in cc.misranked) or "none"))
        print(f"  ratios off by more than {RATIO_TOLERANCE:.0%}: "
              + (", ".join(r.layout for r in cc.ratio_misses) or "none"))
        ok &= cc.ok
    print(f"\nall criteria met: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
