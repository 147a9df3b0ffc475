"""What the planning page needs beyond the planning routes: the links of a machine a what-if can change
(`moment.service.whatif`). The page itself (static files) is mounted at `/` by `create_app`, after the API."""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from fastapi import APIRouter

from moment.service.body import JsonRoute
from moment.service.deps import SettingsDep
from moment.service.schemas import MachineIn
from moment.service.whatif import TargetsResponse, whatif_targets

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

router = APIRouter(tags=["page"], route_class=JsonRoute)


@router.post("/whatif/targets", response_model=TargetsResponse)
def targets(req: MachineIn, s: SettingsDep) -> TargetsResponse:
    """The links of a machine (a built-in profile or an upload) a what-if can change, with the
    `set` path of each: the planning page's link picker."""
    from moment.service.machines import machine

    topo, _ = machine(req, s.max_upload_bytes)
    return whatif_targets(topo)
