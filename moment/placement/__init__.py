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

from moment.lazy import exports

#: name -> the module that defines it; each loads when first used, so a light module of the package (its
#: requests, which the CLI reads at start) does not load the layout writer and DDAK
EXPORTS = {
    "PlaceResult": "moment.placement.api", "place": "moment.placement.api",
    "Assignment": "moment.placement.assignment", "degree_placement": "moment.placement.baselines",
    "hash_placement": "moment.placement.baselines", "Bin": "moment.placement.bins",
    "BinSet": "moment.placement.bins", "ddak": "moment.placement.knapsack",
    "ddak_reference": "moment.placement.knapsack", "write_layout": "moment.placement.layout",
    "LayoutManifest": "moment.placement.manifest", "PlanRef": "moment.placement.manifest",
    "RowFormat": "moment.placement.manifest", "row_format": "moment.placement.manifest",
    "LayoutReader": "moment.placement.reader", "VerifyReport": "moment.placement.reader",
    "open_layout": "moment.placement.reader", "verify_layout": "moment.placement.reader",
    "PlacementReport": "moment.placement.report", "PolicyReport": "moment.placement.report",
    "placement_report": "moment.placement.report", "policy_report": "moment.placement.report",
}
__all__ = sorted(EXPORTS)

__getattr__ = exports(__name__, EXPORTS)
