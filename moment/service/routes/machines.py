"""The machines the planner knows (built-in profiles, device models) and reading an uploaded one."""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from starlette.concurrency import run_in_threadpool

from moment.planner.api import models_json, profiles_json, topology_json
from moment.service.body import JsonRoute
from moment.service.deps import CacheDep, SettingsDep
from moment.service.errors import FieldError, TooLarge
from moment.service.schemas import MACHINE_NAME, UPLOADS, ProfileRow, ScanResponse
from moment.topology.devices import DeviceModel

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

router = APIRouter(tags=["machines"], route_class=JsonRoute)


@router.get("/profiles", response_model=list[ProfileRow])
def profiles(cache: CacheDep) -> list[dict]:
    """The built-in machine profiles (`moment profiles --json`)."""
    if "profiles" not in cache:  # built-in files: read once per process
        cache["profiles"] = profiles_json()
    return cache["profiles"]


@router.get("/models", response_model=list[DeviceModel])
def models() -> list[dict]:
    """The GPU, SSD and NIC models the planner knows (`moment models --json`)."""
    return models_json()


@router.post("/scan", response_model=ScanResponse, response_model_exclude_none=True)
async def scan(
    s: SettingsDep,
    nccl_xml: Annotated[UploadFile | None, File(description=UPLOADS["nccl_xml"])] = None,
    hwloc_xml: Annotated[UploadFile | None, File(description=UPLOADS["hwloc_xml"])] = None,
    lspci: Annotated[UploadFile | None, File(description=UPLOADS["lspci"])] = None,
    lspci_vvv: Annotated[UploadFile | None, File(description=UPLOADS["lspci_vvv"])] = None,
    dmidecode: Annotated[UploadFile | None, File(description=UPLOADS["dmidecode"])] = None,
    nvidia_smi: Annotated[UploadFile | None, File(description=UPLOADS["nvidia_smi"])] = None,
    name: Annotated[str | None, Form(**MACHINE_NAME)] = None,
) -> dict:
    """Read an uploaded machine description (multipart files) into a topology, as
    `moment scan --from-... --json` does; use the result as `profile_yaml` (YAML or JSON) in /v1/plan."""
    from moment.service.machines import read_uploads

    files = {"nccl_xml": nccl_xml, "hwloc_xml": hwloc_xml, "lspci": lspci, "lspci_vvv": lspci_vvv,
             "dmidecode": dmidecode, "nvidia_smi": nvidia_smi}
    texts = {key: await _text(key, f, s.max_upload_bytes) for key, f in files.items() if f is not None}
    if not texts:
        raise FieldError("nccl_xml", "upload one machine description: nccl_xml, hwloc_xml, or lspci / "
                                     "lspci_vvv / dmidecode / nvidia_smi text")
    topo, report = await run_in_threadpool(read_uploads, texts, name)
    return topology_json(topo, report)


async def _text(key: str, f: UploadFile, limit: int) -> str:
    """The uploaded file's text, or TooLarge past `limit` bytes."""
    data = await f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{key}: the upload is more than the service's limit of {limit:,} bytes")
    return data.decode("utf-8", "replace")
