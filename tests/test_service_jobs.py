"""Service jobs (`place`, `probe`): ids, progress, cancellation, results that survive a restart, and
names that never leave the data directory."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402
from moment.service.jobs import JobContext, JobRunner, JobStore  # noqa: E402


def wait(client: TestClient, job_id: str, timeout: float = 120) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {job['state']} after {timeout} s")


def until(cond, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_probe_job_result_survives_a_restart(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", probe_max_mib=64)
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/jobs/probe", json={"ssd_dirs": {"ssd0": "fast"}, "size_mib": 16})
        assert r.status_code == 202, r.text
        job = wait(c, r.json()["id"])
        assert job["state"] == "done", job
        assert set(job["result"]) == {"ssd", "memory_copy_gbps", "cuda"}  # `moment probe --json`'s keys
        assert job["result"]["ssd"]["ssd0"]["seq_read_gbps"] > 0
        assert job["result"]["ssd"]["ssd0"]["path"] == f"probe/fast/.moment-probe-{16 << 20}.bin"
        assert str(tmp_path) not in json.dumps(job)
        assert (tmp_path / "data" / "probe" / "fast").is_dir()
        assert job["progress"]["stage"] == "cuda" and job["finished"] >= job["started"] >= job["created"]
    with TestClient(create_app(settings)) as c:  # a new service on the same database
        again = c.get(f"/v1/jobs/{job['id']}").json()
        assert again == job
        assert [j["id"] for j in c.get("/v1/jobs").json()] == [job["id"]]


@pytest.mark.slow
@pytest.mark.parametrize(("body", "field"), [
    ({"dataset": "../ds", "layout": "L"}, "dataset"),
    ({"dataset": "/etc", "layout": "L"}, "dataset"),
    ({"dataset": "a/b", "layout": "L"}, "dataset"),
    ({"dataset": "missing", "layout": "L"}, "dataset"),
    ({"dataset": "escape", "layout": "L"}, "dataset"),
    ({"dataset": "ds", "layout": ".."}, "layout"),
    ({"dataset": "ds", "layout": "taken"}, "layout"),
    ({"dataset": "ds", "layout": "L", "profile": "../../x"}, "profile"),
    ({"dataset": "ds", "layout": "L", "fanouts": [0]}, "fanouts"),
])
def test_place_names_stay_inside_the_data_directory(tmp_path, body, field):
    data = tmp_path / "data"
    (data / "datasets" / "ds").mkdir(parents=True)
    (data / "layouts" / "taken").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, data / "datasets" / "escape")
    with TestClient(create_app(Settings(data_dir=data))) as c:
        r = c.post("/v1/jobs/place", json=body)
        assert r.status_code == 422, r.text
        assert field in r.json()["detail"]
        assert c.get("/v1/jobs").json() == []  # nothing was queued


@pytest.mark.parametrize(("body", "field"), [
    ({"ssd_dirs": {"ssd0": "../../tmp"}}, "ssd_dirs.ssd0"),
    ({"ssd_dirs": {"ssd0": "/mnt"}}, "ssd_dirs.ssd0"),
    ({"ssd_dirs": {"../x": "a"}}, "ssd_dirs"),
    ({"size_mib": 100_000}, "size_mib"),
])
def test_probe_names_stay_inside_the_data_directory(tmp_path, body, field):
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        r = c.post("/v1/jobs/probe", json=body)
        assert r.status_code == 422 and field in r.json()["detail"], r.text


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torch", "torch_geometric")),
                    reason="placing pre-samples with torch (the `train` extra)")
def test_place_job_writes_the_layout_moment_place_writes(tmp_path):
    from moment.placement import open_layout
    from moment.workload.synth import synthesize

    data = tmp_path / "data"
    synthesize(data / "datasets" / "ds", 3_000, feature_dim=8, seed=3)
    with TestClient(create_app(Settings(data_dir=data))) as c:
        plan = c.post("/v1/plan", json={"gpus": 2, "ssds": 2}).json()
        r = c.post("/v1/jobs/place", json={"dataset": "ds", "layout": "L", "gpus": 2, "ssds": 2, "plan": plan,
                                           "batches": 4, "gpu_cache": "2%", "cpu_cache": "5%"})
        assert r.status_code == 202, r.text
        job = wait(c, r.json()["id"])
        assert job["state"] == "done", job
        res = job["result"]
        # paths relative to the data directory: an answer never shows where the server keeps its data
        assert (res["layout"], res["dataset"]) == ("layouts/L", "datasets/ds")
        assert str(data) not in json.dumps(job) and res["plan"]["placement"] == plan["placement"]
        assert set(res["policies"]) == {"ddak", "hash", "degree"}
        assert open_layout(data / "layouts" / "L").num_nodes == 3_000
        # a second job on the same layout name is refused up front
        r = c.post("/v1/jobs/place", json={"dataset": "ds", "layout": "L"})
        assert r.status_code == 422 and "already exists" in r.json()["detail"]


def _slow(started: threading.Event):
    """A job that reports progress until it is told to stop (as place() does between batches)."""
    def run(request, ctx: JobContext):
        started.set()
        for i in range(10_000):
            ctx.report("step", i, 10_000, force=True)
            time.sleep(0.01)
        return {"steps": 10_000}
    return run


def test_running_job_is_cancelled_and_a_stopped_service_leaves_none_running(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite3")
    started = threading.Event()
    runner = JobRunner(store, {"probe": _slow(started)})
    job = runner.submit("probe", {"n": 1})
    queued = runner.submit("probe", {"n": 2})
    assert started.wait(30)
    assert store.cancel(queued.id).state == "cancelled"  # a queued job stops at once
    store.cancel(job.id)
    until(lambda: store.get(job.id).state == "cancelled")
    assert store.get(job.id).progress.stage == "step"

    started.clear()
    job = runner.submit("probe", {"n": 3})
    assert started.wait(30)
    runner.close()
    assert store.get(job.id).state == "interrupted"
    assert {j.state for j in store.list()} <= {"cancelled", "interrupted"}


def test_jobs_of_a_dead_service_are_interrupted_or_taken_over(tmp_path):
    """A service that died with a job running: the next one marks it interrupted (its result is
    unknown) and runs the jobs it had queued."""
    settings = Settings(data_dir=tmp_path, probe_max_mib=64)
    store = JobStore(settings.data_dir / "jobs.sqlite3")
    dead = f"{os.uname().nodename}:{os.getpid()}:gone"  # this process, an app instance that no longer exists
    running = store.create("probe", {"ssd_dirs": {"ssd0": "a"}, "size_mib": 16, "queue_depth": 8}, dead)
    assert store.claim(dead).id == running.id
    # queued with a request the service's limits refuse when it runs (cheaper than a real probe)
    queued = store.create("probe", {"ssd_dirs": {"ssd0": "b"}, "size_mib": 128, "queue_depth": 8}, dead)
    with TestClient(create_app(settings)) as c:
        job = c.get(f"/v1/jobs/{running.id}").json()
        assert job["state"] == "interrupted" and "submit it again" in job["error"]
        taken = wait(c, queued.id)
        assert taken["state"] == "failed" and taken["error"] == "size_mib: 128 is above the service's limit of 64 MiB"
        assert c.delete(f"/v1/jobs/{queued.id}").json()["state"] == "failed"  # finished: stays as it is
        assert c.delete("/v1/jobs/nope").status_code == 404
        assert c.post("/v1/jobs/nope/cancel").status_code == 404
