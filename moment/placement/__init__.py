"""Data placement: which node embeddings live in each GPU cache, CPU cache and SSD, and on disk how.

    bins = BinSet(bins=[Bin(...), ...])            # storage nodes of the plan, with target shares
    # or, from measured hotness and a plan: see moment.placement.planning (workload_from_hotness,
    # bins_from_plan, run_policies), which `place` drives
    res = place(dataset_dir, out_dir, topology, inventory, plan=plan)   # the whole of `moment place`
    a = ddak(hotness, bins, pool=100)              # or hash_placement / degree_placement
    rep = placement_report({"ddak": a, ...}, row_stride=...)
    path = write_layout(out_dir, features_npy, a, plan=PlanRef(machine=...))
    verify_layout(path); open_layout(path).rows(ids)
"""

from moment.placement.api import PlaceResult, place
from moment.placement.assignment import Assignment
from moment.placement.baselines import degree_placement, hash_placement
from moment.placement.bins import Bin, BinSet
from moment.placement.ddak import ddak, ddak_reference
from moment.placement.layout import write_layout
from moment.placement.manifest import LayoutManifest, PlanRef, RowFormat, row_format
from moment.placement.reader import LayoutReader, VerifyReport, open_layout, verify_layout
from moment.placement.report import PlacementReport, PolicyReport, placement_report, policy_report

__all__ = [
    "Assignment", "Bin", "BinSet", "LayoutReader", "LayoutManifest", "PlaceResult", "PlacementReport", "PlanRef",
    "PolicyReport",
    "RowFormat", "VerifyReport", "ddak", "ddak_reference", "degree_placement", "hash_placement",
    "open_layout", "place", "placement_report", "policy_report", "row_format", "verify_layout", "write_layout",
]
