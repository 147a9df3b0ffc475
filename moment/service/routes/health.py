"""`GET /v1/health`: whether the service is up; the one /v1 route that never needs the token."""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from fastapi import APIRouter

from moment import __version__
from moment.service.deps import SettingsDep
from moment.service.schemas import Health

router = APIRouter()


@router.get("/health", response_model=Health, tags=["service"])
async def health(s: SettingsDep) -> Health:
    """Whether the service is up (never needs the token). Answered on the event loop, never waiting
    for a worker thread, so it stays instant while searches are busy. HEAD answers the same without a
    body (what load balancers' health checks send)."""
    return Health(status="ok", version=__version__, auth=s.token is not None)
