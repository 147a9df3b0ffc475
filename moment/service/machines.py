"""The machine a request names: a built-in profile, or an uploaded description read by the same
readers `moment scan` and `moment plan --profile FILE` use. No request text is ever taken as a path:
built-in profiles are looked up by name only, and uploads are written to a private temporary
directory before the file-based readers see them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moment.errors import MomentError
from moment.planner.api import calibrated
from moment.planner.requests import DEFAULT_PROFILE
from moment.service.errors import FieldError, TooLarge, blame, request_field
from moment.service.schemas import UPLOADS, MachineIn
from moment.topology.cluster import cluster_from_dict
from moment.topology.model import Topology
from moment.topology.profiles import PROFILE_DIR, builtin_names, dump_yaml, load_profile

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

_TEXT_SCANS = ("lspci", "lspci_vvv", "dmidecode", "nvidia_smi")


def builtin_profile_path(name: str, field: str = "profile") -> Path:
    """The built-in profile's file; anything that is not a built-in name is refused."""
    names = builtin_names()
    if name not in names:
        raise FieldError(field, f"unknown built-in profile {name!r} (built-in: {', '.join(names)}; "
                                "upload another machine as profile_yaml, nccl_xml, hwloc_xml or lspci text)")
    return PROFILE_DIR / f"{name}.yaml"


def check_upload(field: str, text: str, limit: int) -> None:
    size = len(text.encode("utf-8", "replace"))
    if size > limit:
        raise TooLarge(f"{field}: the upload is {size:,} bytes, more than the service's limit of {limit:,}")


@contextmanager
def _scratch(field: str) -> Iterator[Path]:
    """A private directory for uploads, each written under its field's name. An error names the upload
    it is about (the file it names, else `field`), and the directory's path is cut out of its message."""
    with tempfile.TemporaryDirectory(prefix="moment-upload-") as d:
        try:
            yield Path(d)
        except MomentError as e:
            if e.field is None:
                ours = e.source is not None and Path(e.source).parent == Path(d)
                e.field = Path(e.source).name if ours else field
            if d + "/" in str(e):
                e.args = (str(e).replace(d + "/", ""),)
            raise


def read_uploads(texts: dict[str, str], name: str | None = None, overrides: list[str] | None = None):
    """A Topology from uploaded text (one kind: a profile, an NCCL XML, an hwloc XML, or saved command
    outputs), with the what-if overrides; (topology, scan report or None)."""
    kinds = {"profile_yaml" if k == "profile_yaml" else "xml" if k.endswith("_xml") else "text"
             for k in texts}
    xmls = [k for k in texts if k.endswith("_xml")]
    if not texts:
        raise FieldError("profile", "no machine given")
    if len(kinds) > 1 or len(xmls) > 1:
        raise FieldError(", ".join(sorted(texts)), "give one kind of machine description: profile_yaml, nccl_xml, "
                         "hwloc_xml, or the command outputs (lspci, lspci_vvv, dmidecode, nvidia_smi)")
    report = None
    with _scratch(next(iter(texts))) as d:
        if "profile_yaml" in texts:
            path = d / "profile_yaml"
            path.write_text(texts["profile_yaml"])
            topo = load_profile(str(path), overrides, flag=request_field)
            return (topo.model_copy(update={"name": name}) if name else topo), None
        if "nccl_xml" in texts:
            from moment.topology.readers.nccl_xml import read_nccl_xml

            topo = read_nccl_xml(texts["nccl_xml"].encode(), name=name or "uploaded-nccl")  # bytes: never a path
        elif "hwloc_xml" in texts:
            from moment.topology.readers.hwloc_xml import read_hwloc_xml

            topo = read_hwloc_xml(texts["hwloc_xml"].encode(), name=name or "uploaded-hwloc")
        else:
            from moment.topology.scan import scan_files

            paths = {}
            for k in _TEXT_SCANS:
                if k in texts:
                    (d / k).write_text(texts[k])
                    paths[k] = d / k
            topo, report = scan_files(**paths, name=name or "uploaded")
        if overrides:  # the overrides apply to the profile as `moment scan --out` would save it
            path = d / "scanned.yaml"
            path.write_text(dump_yaml(topo))
            topo = load_profile(str(path), overrides, flag=request_field)
    return topo, report


def machine(req: MachineIn, upload_limit: int) -> tuple[Topology, str]:
    """The request's machine with its overrides and calibration applied, and its name (as the CLI names
    it: the profile name given, or the uploaded machine's name)."""
    texts = {k: getattr(req, k) for k in UPLOADS if getattr(req, k) is not None}
    for k, v in texts.items():
        check_upload(k, v, upload_limit)
    if texts and req.profile is not None:
        raise FieldError("profile", f"give a built-in profile or an upload ({', '.join(texts)}), not both")
    if texts:
        topo, _ = read_uploads(texts, req.name, req.overrides)
        label = topo.name
    else:
        label = DEFAULT_PROFILE if req.profile is None else req.profile
        topo = load_profile(str(builtin_profile_path(label)), req.overrides, flag=request_field)
    with blame("calibration"):
        return calibrated(topo, req.calibration), label


def cluster_spec(spec):
    """The request's cluster, checked as a cluster file is (NIC model, ports), its servers naming
    built-in profiles only: (spec, load), `load` reading a server's profile by that name."""
    for i, server in enumerate(spec.servers):
        builtin_profile_path(server.profile, f"cluster.servers[{i}].profile")
    with blame("cluster"):
        spec = cluster_from_dict(spec.model_dump(), "cluster")
    return spec, lambda name: load_profile(str(builtin_profile_path(name)))
