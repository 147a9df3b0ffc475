"""Jobs: `moment place` and `moment probe` run in the service's job workers, polled and cancelled here.
Every worker process of the service shares them through the one SQLite store."""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from fastapi import APIRouter, HTTPException

from moment.service.body import JsonRoute
from moment.service.deps import RunnerDep, SettingsDep, StoreDep
from moment.service.errors import error_responses
from moment.service.jobs import JobStore
from moment.service.schemas import Job, PlaceJobRequest, ProbeJobRequest

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=JsonRoute,
                   responses=error_responses(503))  # the job database out of reach


@router.post("/place", response_model=Job, status_code=202, responses=error_responses(429))
def place_job(req: PlaceJobRequest, s: SettingsDep, runner: RunnerDep) -> Job:
    """Start `moment place` on DATA_DIR/datasets/DATASET, writing DATA_DIR/layouts/LAYOUT; poll the job."""
    from moment.service.tasks import check_place

    check_place(req, s.data_dir)
    return runner.submit("place", req.model_dump(mode="json", by_alias=True))


@router.post("/probe", response_model=Job, status_code=202, responses=error_responses(429))
def probe_job(req: ProbeJobRequest, s: SettingsDep, runner: RunnerDep) -> Job:
    """Start `moment probe` on directories under DATA_DIR/probe/; poll the job."""
    from moment.service.tasks import check_probe

    check_probe(req, s.data_dir, s.probe_max_mib, s.probe_max_job_mib)
    return runner.submit("probe", req.model_dump(mode="json"))


@router.get("", response_model=list[Job])
def jobs(store: StoreDep) -> list[Job]:
    """The latest jobs, newest first."""
    return store.list()


@router.get("/{job_id}", response_model=Job)
def job(job_id: str, store: StoreDep) -> Job:
    """A job's state, progress, and result or error."""
    return _job(store, job_id)


@router.delete("/{job_id}", response_model=Job)
def cancel(job_id: str, store: StoreDep) -> Job:
    """Cancel a job: a queued one at once, a running one at its next progress report."""
    _job(store, job_id)
    job = store.cancel(job_id)
    assert job is not None
    return job


@router.post("/{job_id}/cancel", response_model=Job)
def cancel_post(job_id: str, store: StoreDep) -> Job:
    """The same as DELETE /v1/jobs/{job_id}, for clients that cannot send DELETE."""
    return cancel(job_id, store)


def _job(store: JobStore, job_id: str) -> Job:
    job = store.get(job_id)
    if job is None:
        raise HTTPException(404, f"job_id: no job {job_id!r}")
    return job
