"""The planner's own HiGHS call (`moment.planner.highs`) answers as `scipy.optimize.linprog(method="highs")`
does, to the last bit: plans made before and after the switch are the same."""

from __future__ import annotations

import numpy as np
import pytest

from moment.planner import lp as planner_lp
from moment.planner.highs import linprog
from moment.planner.network import ChassisTemplate
from moment.planner.search import enumerate_placements
from moment.topology.devices import Inventory, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec


def _scipy(lp: dict):
    from scipy.optimize import linprog as scipy_linprog  # here: not loaded by every worker's collection
    from scipy.sparse import csr_matrix

    n, n_ub, n_eq = len(lp["c"]), len(lp["b_ub"]), len(lp["b_eq"])
    (ur, uc, uv), (er, ec, ev) = lp["A_ub"], lp["A_eq"]
    return scipy_linprog(lp["c"], A_ub=csr_matrix((uv, (ur, uc)), shape=(n_ub, n)), b_ub=lp["b_ub"],
                         A_eq=csr_matrix((ev, (er, ec)), shape=(n_eq, n)), b_eq=lp["b_eq"], bounds=lp["bounds"],
                         method="highs")


# paper-machine-b: a PCIe tree (path form, with entries summed where GPUs share a route: nine GPUs'
# shares of 1/9 add up to 1 only one after the other); dgx2: NVLink (several routes per pair, and the
# edge form)
@pytest.mark.parametrize("profile, inventory, formulation", [
    ("paper-machine-b", Inventory.simple(4, 8), "auto"),
    ("paper-machine-b", Inventory.simple(9, 11, "T4", "990-PRO"), "auto"),
    ("dgx2", Inventory.simple(0, 8), "auto"),
    ("dgx2", Inventory.simple(0, 8), "edges"),
])
def test_a_batch_of_placement_lps_solves_to_scipys_point(profile, inventory, formulation):
    bare = strip(load_profile(profile))[0]
    tpl = ChassisTemplate(bare)
    nets = [tpl.network(p, WorkloadSpec()) for p in enumerate_placements(bare, inventory).distinct[:24]]
    lp = planner_lp._stack([planner_lp._parts(n, formulation) for n in nets])
    lp.pop("col0")
    mine, ref = linprog(**lp), _scipy(lp)
    assert ref.status == 0 and mine.ok
    assert np.array_equal(mine.x, ref.x)


@pytest.mark.parametrize("profile, inventory, formulation", [
    ("paper-machine-b", Inventory.simple(4, 8), "auto"),
    ("paper-machine-b", Inventory.simple(9, 11, "T4", "990-PRO"), "auto"),
    ("asus-esc8000a-e12", Inventory.simple(2, 6), "auto"),
    ("hgx-a100-8gpu", Inventory.simple(0, 3), "edges"),  # NVLink
])
@pytest.mark.parametrize("data", ["planned", "even"])
def test_the_searches_screening_lps_give_the_times_presolve_gives(profile, inventory, formulation, data):
    """The searches compare times only, within a relative tolerance far above rounding: solved without presolve
    (`screen`) every placement's time is the presolved one's to within 1e-9, so the same placements win."""
    bare = strip(load_profile(profile))[0]
    tpl = ChassisTemplate(bare)
    listed = enumerate_placements(bare, inventory).distinct
    nets = [tpl.network(p, WorkloadSpec()) for p in listed[:: max(1, len(listed) // 40)][:40]]  # across the list
    full = [s.epoch_read_s for s in planner_lp.solve_lp_batch(nets, formulation=formulation, data=data)]
    screened = [s.epoch_read_s for s in planner_lp.solve_lp_batch(nets, formulation=formulation, data=data,
                                                                  screen=True)]
    assert len(set(full)) > 1 or data == "even" and "hgx" in profile  # placements that differ (the HGX's
    # three SSDs spread evenly over its bays are equally fast wherever they go)
    np.testing.assert_allclose(screened, full, rtol=1e-9, atol=0)


def test_an_infeasible_lp_is_not_ok_as_scipy_says():
    # x0 + x1 = 3 with both in [0, 1]
    lp = {"c": np.array([1.0, 1.0]), "A_ub": (np.array([0]), np.array([0]), np.array([1.0])), "b_ub": np.array([5.0]),
          "A_eq": (np.array([0, 0]), np.array([0, 1]), np.array([1.0, 1.0])), "b_eq": np.array([3.0]),
          "bounds": np.array([[0.0, 1.0], [0.0, 1.0]])}
    res = linprog(**lp)
    assert _scipy(lp).status == 2
    assert not res.ok and res.x is None and "nfeasible" in res.message
