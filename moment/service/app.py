"""The ASGI app: `create_app(settings)`, or `create_app()` reading MOMENT_* variables (the entry point
for `uvicorn --factory moment.service.app:create_app --workers N`).

`create_app` builds the app's state (settings, job runner, search slots, cache), which the routes read
through moment.service.deps, and includes the routers of moment.service.routes, one per area. Every
handler calls the function the matching CLI command calls (moment.planner.api and friends), so
`POST /v1/plan` answers what `moment plan --json` prints for the same inputs.
"""

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from moment import __version__
from moment.errors import MomentError
from moment.service.access import LocalOnly
from moment.service.config import Settings
from moment.service.deadline import Searches
from moment.service.deps import authorised
from moment.service.errors import (JSON, Busy, TimedOut, TooLarge, Unavailable, error, error_responses,
                                   validation_detail)
from moment.service.jobs import JobRunner, JobStore
from moment.service.limits import BodyLimit, quiet_accept_errors
from moment.service.methods import HeadAsGet
from moment.service.paths import relative
from moment.service.routes import fallback, health, jobs, machines, page, planning
from moment.service.tasks import run_place, run_probe

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

STATIC = Path(__file__).resolve().parent / "static"

#: what any route may answer; the searches add 408 and 429, the job submissions 429
COMMON_ERRORS = error_responses(401, 403, 404, 405, 413, 422)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service for `settings` (default: from the MOMENT_* environment variables): its state, which
    the routes read through moment.service.deps, and the routers of moment.service.routes."""
    s = (settings or Settings.from_env()).checked()
    app = FastAPI(
        title="Moment placement service", version=__version__, lifespan=_lifespan, default_response_class=JSON,
        description="Plan where GPUs and SSDs go, compare machines, replay epochs and run data placement: "
                    "the `moment` command's answers as JSON. With a token, every /v1 route but health needs "
                    "`Authorization: Bearer TOKEN`.",
        responses=COMMON_ERRORS,
    )
    app.state.settings, app.state.jobs = s, _job_runner(s)
    app.state.searches, app.state.cache = Searches(s.max_searches, s.max_waiting_searches), {}
    app.add_middleware(BodyLimit, limit=s.max_body_bytes, timeout_s=s.body_timeout_s)
    app.add_middleware(HeadAsGet)
    app.add_middleware(LocalOnly, settings=s)  # outermost: a refused connection costs nothing more
    _handlers(app)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorised)])  # every route but health needs the token
    for area in (machines, planning, jobs, page):
        v1.include_router(area.router)
    app.include_router(health.router, prefix="/v1")
    app.include_router(v1)
    fallback.add_fallback(app)
    if STATIC.is_dir():  # the web page, when shipped: after the API so /v1 and /openapi.json win
        from fastapi.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")
    return app


def _job_runner(s: Settings) -> JobRunner:
    """The runner of `place` and `probe` jobs, over the SQLite store at `s.db_path`."""
    return JobRunner(JobStore(s.db_path), {"place": lambda r, ctx: run_place(r, ctx, s.data_dir),
                                           "probe": lambda r, ctx: run_probe(r, ctx, s.data_dir, s.probe_max_mib,
                                                                             s.probe_max_job_mib)},
                     workers=s.job_workers, max_queued=s.max_queued_jobs, shown=lambda v: relative(v, s.data_dir))


@asynccontextmanager
async def _lifespan(app: FastAPI):
    quiet_accept_errors(asyncio.get_running_loop())
    yield
    app.state.jobs.close()


def _handlers(app: FastAPI) -> None:
    """Every error a request can cause becomes a JSON answer with `detail`; none is a 500."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSON:
        detail, errors = validation_detail(list(exc.errors()))
        return error(422, detail, errors=errors)

    @app.exception_handler(MomentError)
    async def _moment_error(request: Request, exc: MomentError) -> JSON:
        text, tail = str(exc), f"\n  hint: {exc.hint}"
        hint = {}
        if exc.hint and text.endswith(tail):  # the CLI's second line, as its own key
            text, hint = text[:-len(tail)], {"hint": exc.hint}
        if exc.remedies:
            hint["remedies"] = [{"field": k, "message": v} for k, v in exc.remedies.items()]
        return error(422, text, errors=[{"field": exc.field or "body", "message": text}], **hint)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSON:
        if exc.status_code != 400:  # 401, 404 and 405 as FastAPI answers them, in this JSON
            return JSON({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        # a body FastAPI or Starlette could not parse (bad UTF-8 in JSON, a broken multipart form): bad input
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):
            why = f"not UTF-8 text (byte 0x{cause.object[cause.start]:02x} at position {cause.start})"
        elif isinstance(cause, RecursionError):
            why = "nested too deep to read"
        elif cause is not None:
            why = f"cannot be read ({type(cause).__name__}: {cause})"
        else:
            why = f"not a valid form ({exc.detail})"
        return error(422, f"body: {why}", errors=[{"field": "body", "message": why}])

    @app.exception_handler(TooLarge)
    async def _too_large(request: Request, exc: TooLarge) -> JSON:
        return error(413, str(exc))

    @app.exception_handler(Busy)
    async def _busy(request: Request, exc: Busy) -> JSON:
        return JSON({"detail": str(exc)}, status_code=429, headers={"Retry-After": "5"})

    @app.exception_handler(TimedOut)
    async def _timed_out(request: Request, exc: TimedOut) -> JSON:
        return error(408, str(exc))

    @app.exception_handler(Unavailable)
    async def _unavailable(request: Request, exc: Unavailable) -> JSON:
        return JSON({"detail": f"{exc}; try again later"}, status_code=503, headers={"Retry-After": "10"})
