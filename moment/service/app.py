"""The ASGI app: `create_app(settings)`, or `create_app()` reading MOMENT_* variables (the entry point
for `uvicorn --factory moment.service.app:create_app --workers N`).

Every handler calls the function the matching CLI command calls (moment.planner.api and friends), so
`POST /v1/plan` answers what `moment plan --json` prints for the same inputs.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations, which name locals

import hmac
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, File, Form, HTTPException, Request, Response, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from moment.errors import MomentError
from moment.service.access import LocalOnly
from moment.service.config import MiB, Settings
from moment.service.deadline import Searches, run_with_deadline
from moment.service.errors import (
    INVENTORY_INPUTS, JSON, Busy, FieldError, TimedOut, TooLarge, blame, error, error_responses, given_beside_inventory,
    request_field, validation_detail)
from moment.service.limits import BodyLimit
from moment.service.schemas import (
    UPLOADS, ClusterPlanRequest, ClusterPlanResponse, CompareRequest, CompareRow, Health, Job, PlaceJobRequest, PlanRequest, PlanResponse,
    ProbeJobRequest, ProfileRow, ScanResponse, SimulateRequest, SimulateResponse)
from moment.topology.devices import DeviceModel

STATIC = Path(__file__).resolve().parent / "static"



#: what any route may answer; the searches add 408 and 429, the job submissions 429
COMMON_ERRORS = error_responses(401, 403, 404, 405, 413, 422)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service for `settings` (default: from the MOMENT_* environment variables)."""
    from moment import __version__
    from moment.service.jobs import JobRunner, JobStore
    from moment.service.paths import relative
    from moment.service.tasks import run_place, run_probe

    s = (settings or Settings.from_env()).checked()
    store = JobStore(s.db_path)
    runner = JobRunner(store, {"place": lambda r, ctx: run_place(r, ctx, s.data_dir),
                               "probe": lambda r, ctx: run_probe(r, ctx, s.data_dir, s.probe_max_mib,
                                                                 s.probe_max_job_mib)},
                       workers=s.job_workers, max_queued=s.max_queued_jobs,
                       shown=lambda v: relative(v, s.data_dir))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        runner.close()

    app = FastAPI(
        title="Moment placement service", version=__version__, lifespan=lifespan, default_response_class=JSON,
        description="Plan where GPUs and SSDs go, compare machines, replay epochs and run data placement: "
                    "the `moment` command's answers as JSON. With a token, every /v1 route but health needs "
                    "`Authorization: Bearer TOKEN`.",
        responses=COMMON_ERRORS,
    )
    app.state.settings, app.state.jobs = s, runner
    app.add_middleware(BodyLimit, limit=s.max_body_bytes)
    app.add_middleware(LocalOnly, settings=s)  # outermost: a refused connection costs nothing more
    _handlers(app)

    bearer = HTTPBearer(auto_error=False, description="the token given to `moment serve --token`")

    async def authorised(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if s.token is None:
            return
        if creds is None or not hmac.compare_digest(creds.credentials.encode(), s.token.encode()):
            raise HTTPException(401, "missing or wrong bearer token: send `Authorization: Bearer TOKEN`",
                                headers={"WWW-Authenticate": "Bearer"})

    cache: dict[str, Any] = {}
    slots = Searches(s.max_searches, s.max_waiting_searches)
    searching = [Depends(slots.admission)]  # the routes that search: a place among the searches, or 429
    search_errors = error_responses(408, 429)
    open_routes = APIRouter(prefix="/v1")
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorised)])

    @open_routes.get("/health", response_model=Health, tags=["service"])
    async def health() -> Health:
        """Whether the service is up (never needs the token). Answered on the event loop, never waiting
        for a worker thread, so it stays instant while searches are busy."""
        return Health(status="ok", version=__version__, auth=s.token is not None)

    @open_routes.head("/health", include_in_schema=False)
    async def health_head() -> Response:  # what load balancers' health checks send
        return Response()

    @v1.get("/profiles", response_model=list[ProfileRow], tags=["machines"])
    def profiles() -> list[dict]:
        """The built-in machine profiles (`moment profiles --json`)."""
        from moment.planner.api import profiles_json

        if "profiles" not in cache:  # built-in files: read once per process
            cache["profiles"] = profiles_json()
        return cache["profiles"]

    @v1.get("/models", tags=["machines"], response_model=list[DeviceModel])
    def models() -> list[dict]:
        """The GPU, SSD and NIC models the planner knows (`moment models --json`)."""
        from moment.planner.api import models_json

        return models_json()

    @v1.post("/plan", response_model=PlanResponse, response_model_exclude_unset=True, tags=["planning"],
             dependencies=searching,
             responses=search_errors)
    def plan(req: PlanRequest) -> dict:
        """Recommend which slot gets which GPU and SSD (`moment plan --json`); `diagram: true` adds the
        recommended machine's picture as `diagram_svg`."""
        from moment.planner import api
        from moment.service.machines import machine

        topo, _ = machine(req, s.max_upload_bytes)
        api.check_one_inventory(req.inventory is not None, flag=request_field, **given_beside_inventory(req))
        with blame("inventory" if req.inventory else None, instead_of=INVENTORY_INPUTS):
            gpus = api.resolve_gpus(topo, req.gpus, flag=request_field) if not req.inventory else 0
            inv = api.parse_inventory(req.inventory, gpus, req.ssds, req.gpu_model, req.ssd_model,
                                      flag=request_field)
            wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share,
                                   flag=request_field)
            result, out = run_with_deadline(
                lambda progress: api.plan_machine(topo, inv, wl, overrides=req.overrides,
                                                  calibration=req.calibration, calibration_source="request",
                                                  replay=req.replay, maxflow_backend=req.maxflow_backend,
                                                  progress=progress, data=req.data),
                s.plan_timeout_s, "the plan search", slots)
        if req.diagram:
            out["diagram_svg"] = api.plan_svg(topo, result)
        return out

    @v1.post("/plan/cluster", response_model=ClusterPlanResponse, response_model_exclude_unset=True,
             tags=["planning"], dependencies=searching, responses=search_errors)
    def plan_cluster(req: ClusterPlanRequest) -> dict:
        """Plan a cluster (`moment plan --cluster FILE --json`): each server's GPUs, SSDs and NICs, and the
        epoch with the network's part; servers name built-in profiles (GET /v1/profiles)."""
        from moment.planner import api
        from moment.planner.cluster import ClusterPlan
        from moment.service.machines import cluster_spec
        from moment.service.worker import plan_cluster_json, run_capped

        spec, load = cluster_spec(req.cluster)
        with blame("cluster"):
            wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share,
                                   flag=request_field)
            # in a worker process: the deadline kills it, its memory is capped (moment.service.worker)
            out = run_capped(plan_cluster_json, (spec.model_dump(), wl.model_dump(), req.remote_fraction),
                             s.plan_timeout_s, "the cluster plan", s.request_max_mib * MiB, slots)
        if req.diagram:
            result = ClusterPlan.model_validate(out)
            svgs: dict[int, str] = {}  # one per server entry: its machines are equal
            for m in result.machines:
                if m.server not in svgs:
                    svgs[m.server] = api.plan_svg(load(m.profile), m.plan.model_copy(update={"placement": m.placement}))
            out["diagrams_svg"] = {m.name: svgs[m.server] for m in result.machines}
        return out

    @v1.post("/compare", response_model=list[CompareRow], response_model_exclude_unset=True, tags=["planning"],
             dependencies=searching,
             responses=search_errors)
    def compare(req: CompareRequest) -> list[dict]:
        """Plan several built-in machines (or inventories) and put the best layouts side by side
        (`moment compare --json`)."""
        from moment.planner import api
        from moment.service.machines import builtin_profile_path
        from moment.topology.profiles import load_profile

        machines = []
        for i, name in enumerate(req.profiles):
            topo = load_profile(str(builtin_profile_path(name, f"profiles.{i}")), req.overrides, flag=request_field)
            with blame("calibration"):
                machines.append((name, api.calibrated(topo, req.calibration)))

        def flag(name: str) -> str:  # one `inventories` entry is what the CLI calls --inventory
            return "inventories" if name == "inventory" else name

        api.check_one_inventory(bool(req.inventories), flag=flag, **given_beside_inventory(req))
        with blame("inventories" if req.inventories else None, instead_of=INVENTORY_INPUTS):
            rows = run_with_deadline(
                lambda progress: api.compare_rows(machines, inventories=req.inventories, gpus=req.gpus,
                                                  ssds=req.ssds, gpu_model=req.gpu_model, ssd_model=req.ssd_model,
                                                  overrides=req.overrides, calibration=req.calibration, flag=flag,
                                                  progress=progress, data=req.data),
                s.plan_timeout_s, "the comparison", slots)
        return rows

    @v1.post("/simulate", response_model=SimulateResponse, response_model_exclude_unset=True, tags=["planning"],
             dependencies=searching,
             responses=search_errors)
    def simulate(req: SimulateRequest) -> dict:
        """Replay an epoch step by step (`moment simulate --json`): a named layout of the profile
        (`placement`, with `gpus`/`ssds`) or a plan's recommended placement (`plan`)."""
        from moment.planner import api
        from moment.service.machines import machine

        if (req.placement is None) == (req.plan is None):
            raise FieldError("placement", "give one of placement (a layout named in the profile) or plan")
        if req.plan is not None and req.profile is None and not any(getattr(req, k) for k in UPLOADS):
            req = req.model_copy(update={"profile": req.plan.machine})
        topo, _ = machine(req, s.max_upload_bytes)

        data = req.data or (req.plan.data if req.plan is not None else api.DEFAULT_DATA)

        def work(progress):
            if req.plan is not None:
                with blame("plan"):
                    return api.simulate_plan(topo, req.plan, steps=req.steps, seed=req.seed, uniform=req.uniform,
                                             data=data)
            return api.simulate_named(topo, req.placement, req.gpus, req.ssds, steps=req.steps, seed=req.seed,
                                      uniform=req.uniform, flag=request_field, data=data)

        rep = run_with_deadline(work, s.plan_timeout_s, "the replay", slots)
        return api.replay_json(rep, req.calibration, data)

    @v1.post("/scan", response_model=ScanResponse, response_model_exclude_none=True, tags=["machines"])
    async def scan(
        nccl_xml: Annotated[UploadFile | None, File(description=UPLOADS["nccl_xml"])] = None,
        hwloc_xml: Annotated[UploadFile | None, File(description=UPLOADS["hwloc_xml"])] = None,
        lspci: Annotated[UploadFile | None, File(description=UPLOADS["lspci"])] = None,
        lspci_vvv: Annotated[UploadFile | None, File(description=UPLOADS["lspci_vvv"])] = None,
        dmidecode: Annotated[UploadFile | None, File(description=UPLOADS["dmidecode"])] = None,
        nvidia_smi: Annotated[UploadFile | None, File(description=UPLOADS["nvidia_smi"])] = None,
        name: Annotated[str | None, Form(max_length=200, description="name of the machine")] = None,
    ) -> dict:
        """Read an uploaded machine description (multipart files) into a topology, as
        `moment scan --from-... --json` does; use the result as `profile_yaml` (YAML or JSON) in /v1/plan."""
        from starlette.concurrency import run_in_threadpool

        from moment.planner.api import topology_json
        from moment.service.machines import read_uploads

        files = {"nccl_xml": nccl_xml, "hwloc_xml": hwloc_xml, "lspci": lspci, "lspci_vvv": lspci_vvv,
                 "dmidecode": dmidecode, "nvidia_smi": nvidia_smi}
        texts = {}
        for key, f in files.items():
            if f is None:
                continue
            data = await f.read(s.max_upload_bytes + 1)
            if len(data) > s.max_upload_bytes:
                raise TooLarge(f"{key}: the upload is more than the service's limit of {s.max_upload_bytes:,} bytes")
            texts[key] = data.decode("utf-8", "replace")
        if not texts:
            raise FieldError("nccl_xml", "upload one machine description: nccl_xml, hwloc_xml, or lspci / "
                                         "lspci_vvv / dmidecode / nvidia_smi text")
        topo, report = await run_in_threadpool(read_uploads, texts, name)
        return topology_json(topo, report)

    # ---- jobs ----------------------------------------------------------------------------------------
    @v1.post("/jobs/place", response_model=Job, status_code=202, tags=["jobs"], responses=error_responses(429))
    def place_job(req: PlaceJobRequest) -> Job:
        """Start `moment place` on DATA_DIR/datasets/DATASET, writing DATA_DIR/layouts/LAYOUT; poll the job."""
        from moment.service.tasks import check_place

        check_place(req, s.data_dir)
        return runner.submit("place", req.model_dump(mode="json", by_alias=True))

    @v1.post("/jobs/probe", response_model=Job, status_code=202, tags=["jobs"], responses=error_responses(429))
    def probe_job(req: ProbeJobRequest) -> Job:
        """Start `moment probe` on directories under DATA_DIR/probe/; poll the job."""
        from moment.service.tasks import check_probe

        check_probe(req, s.data_dir, s.probe_max_mib, s.probe_max_job_mib)
        return runner.submit("probe", req.model_dump(mode="json"))

    @v1.get("/jobs", response_model=list[Job], tags=["jobs"])
    def jobs() -> list[Job]:
        """The latest jobs, newest first."""
        return store.list()

    def _job(job_id: str) -> Job:
        job = store.get(job_id)
        if job is None:
            raise HTTPException(404, f"job_id: no job {job_id!r}")
        return job

    @v1.get("/jobs/{job_id}", response_model=Job, tags=["jobs"])
    def job(job_id: str) -> Job:
        """A job's state, progress, and result or error."""
        return _job(job_id)

    @v1.delete("/jobs/{job_id}", response_model=Job, tags=["jobs"])
    def cancel(job_id: str) -> Job:
        """Cancel a job: a queued one at once, a running one at its next progress report."""
        _job(job_id)
        job = store.cancel(job_id)
        assert job is not None
        return job

    @v1.post("/jobs/{job_id}/cancel", response_model=Job, tags=["jobs"])
    def cancel_post(job_id: str) -> Job:
        """The same as DELETE /v1/jobs/{job_id}, for clients that cannot send DELETE."""
        return cancel(job_id)

    from moment.service import web_routes  # the page's routes: /v1/whatif/targets, /v1/advise
    v1.include_router(web_routes.router(s, slots))
    app.include_router(open_routes)
    app.include_router(v1)

    @app.api_route("/v1/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                   include_in_schema=False)
    async def unknown(rest: str, request: Request) -> JSON:
        """JSON for any other /v1 request, not the page's 404: a 405 naming the methods when the path is a
        route's (this catch-all would otherwise hide that), else a 404."""
        from starlette.routing import Match

        routes = [r for r in app.router.routes if getattr(r, "endpoint", None) is not unknown
                  and r.matches(request.scope)[0] == Match.PARTIAL]  # the path matches, the method not
        allowed = [m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
                   if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)]
        if allowed:
            return JSON({"detail": f"{request.method} is not allowed on /v1/{rest}; use {', '.join(allowed)}"},
                        status_code=405, headers={"Allow": ", ".join(allowed)})
        return error(404, f"no route /v1/{rest}; see /openapi.json")

    if STATIC.is_dir():  # the web page, when shipped: after the API so /v1 and /openapi.json win
        from fastapi.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")
    return app


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
