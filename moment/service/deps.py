"""What the routes depend on, read from `app.state` (which `create_app` fills) through `Depends`: the
settings, the job runner, the bound on concurrent searches, the token check and a per-process cache.

Every dependency here is `async`, so it runs on the event loop: none waits for a worker thread (health
stays instant while searches are busy, and a search's place is taken before any thread is)."""

# no `from __future__ import annotations`: FastAPI reads these functions' annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from moment.service.config import Settings
from moment.service.deadline import Searches
from moment.service.errors import error_responses
from moment.service.jobs import JobRunner, JobStore

bearer = HTTPBearer(auto_error=False, description="the token given to `moment serve --token`")


async def settings(request: Request) -> Settings:
    """The app's settings (limits, data directory, token)."""
    return request.app.state.settings


async def runner(request: Request) -> JobRunner:
    """The app's job runner (its worker threads run the submitted jobs)."""
    return request.app.state.jobs


async def store(request: Request) -> JobStore:
    """The jobs' SQLite store, shared by every worker process of the service."""
    return request.app.state.jobs.store


async def searches(request: Request) -> Searches:
    """The app's bound on the searches running and waiting at once."""
    return request.app.state.searches


async def cache(request: Request) -> dict[str, Any]:
    """Answers computed once per process (the built-in profiles)."""
    return request.app.state.cache


SettingsDep = Annotated[Settings, Depends(settings)]
RunnerDep = Annotated[JobRunner, Depends(runner)]
StoreDep = Annotated[JobStore, Depends(store)]
SearchesDep = Annotated[Searches, Depends(searches)]
CacheDep = Annotated[dict[str, Any], Depends(cache)]


async def authorised(s: SettingsDep,
                     creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """The token check of every /v1 route but health: with a token set, `Authorization: Bearer TOKEN`."""
    check_token(s, creds.credentials if creds is not None else None)


def check_token(s: Settings, credentials: str | None) -> None:
    """Refuse (401) a request without the service's token, where it has one. Also asked by
    `moment.service.body.JsonRoute` before it reads a body: a client without the token is not read."""
    if s.token is None:
        return
    if credentials is None or not hmac.compare_digest(credentials.encode(), s.token.encode()):
        raise HTTPException(401, "missing or wrong bearer token: send `Authorization: Bearer TOKEN`",
                            headers={"WWW-Authenticate": "Bearer"})


async def search_slot(slots: SearchesDep) -> AsyncIterator[None]:
    """A place among the running or waiting searches for the whole request, or Busy (429) at once."""
    with slots.admitted():
        yield


#: the routes that search: a place among the searches (or 429), and their error answers
SEARCHING = [Depends(search_slot)]
SEARCH_ERRORS = error_responses(408, 429)
