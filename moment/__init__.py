"""Moment: plan and run multi-GPU out-of-core GNN training.

The Python API is one typed request and one function per use case, the same the commands and the service
run: `moment.plan(moment.PlanRequest(profile="paper-machine-b", gpus=4))`, `moment.place(...)`,
`moment.advise(...)`, ... (docs/python-api.md lists them), and `moment.open_run(layout, ...)`, the
out-of-core store and pipelined loader for your own training loop (needs the `train` extra). Importing
`moment` itself imports nothing else: each name loads its module when first used, so planning never loads
torch.
"""

from moment.lazy import exports

__version__ = "0.1.0"

#: name -> the module that defines it
API = {
    "MomentError": "moment.errors",
    "open_run": "moment.runtime.run", "Run": "moment.runtime.run", "Batch": "moment.runtime.run",
    "build_model": "moment.runtime.models",
    "import_graph": "moment.workload.import_pyg", "open_dataset": "moment.workload.graph",
    "PlanRequest": "moment.planner.requests", "plan": "moment.planner.requests",
    "ClusterPlanRequest": "moment.planner.requests", "cluster_plan": "moment.planner.requests",
    "CompareRequest": "moment.planner.requests", "compare": "moment.planner.requests",
    "SimulateRequest": "moment.planner.requests", "simulate": "moment.placement.simulation",
    "CalibrateRequest": "moment.planner.requests", "calibrate": "moment.planner.requests",
    "ProbeRequest": "moment.io.probing", "probe": "moment.io.probing",
    "AdviseRequest": "moment.cost.requests", "advise": "moment.cost.requests",
    "PlaceRequest": "moment.placement.requests", "place": "moment.placement.requests",
    "PackRequest": "moment.placement.requests", "pack": "moment.runtime.packing",
}
__all__ = [*API, "__version__"]

__getattr__ = exports(__name__, API)


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
