"""`GET /v1/health`: whether the service is up; the one /v1 route that never needs the token."""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from fastapi import APIRouter, Response

from moment import __version__
from moment.service.deps import RunnerDep, SettingsDep
from moment.service.schemas import Health

router = APIRouter()


@router.get("/health", response_model=Health, response_model_exclude_none=True, tags=["service"],
            responses={503: {"description": "jobs cannot run (`problem` says why)", "model": Health}})
async def health(s: SettingsDep, runner: RunnerDep, response: Response) -> Health:
    """Whether the service is up (never needs the token): 503 and `degraded` when its jobs cannot run (a
    job worker gone or stuck, the job database failing). Answered on the event loop from what the job
    workers last saw, never waiting for a worker thread or the database, so it stays instant while
    searches are busy. HEAD answers the same without a body (what load balancers' health checks send)."""
    problem = runner.problem()
    if problem is not None:
        response.status_code = 503
    return Health(status="degraded" if problem else "ok", version=__version__, auth=s.token is not None,
                  problem=problem)

