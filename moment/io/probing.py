"""`ProbeRequest`: every option of `moment probe`, and `probe(req)`, the use case it runs (the service's
probe job is derived from this model, its SSD directories names under its data directory, with its limits:
moment.service.schemas), so every default is declared here once.

    result = probe(ProbeRequest(ssd_paths=["ssd0=/mnt/nvme0"], size_mib=256))   # `moment probe --json`'s
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from moment.errors import Flag, MomentError, cli_flag
from moment.inputs import parse_ssd_paths
from moment.outputs import atomic_write, check_output
from moment.requests import Cli, Request, cli_of, expect

# Imports inside functions: the I/O stack and the profiles load only when a probe runs, so the command line
# that declares the options starts fast.


class ProbeRequest(Request):
    """Every option of `moment probe`; defaults here and nowhere else."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ssd_paths: Annotated[list[str], Cli(("--ssd-path",))] = Field(
        default_factory=list,
        description="SSDID=DIRECTORY on that SSD's file system, repeatable (default: ssd0=.)")
    size_mib: int = Field(1024, description="scratch file per SSD, MiB (removed afterwards unless --keep-scratch)")
    keep_scratch: bool = Field(False, description="leave the scratch files for the next probe of the same size")
    queue_depth: int = Field(32, description="reads in flight (as fio's iodepth)")
    profile: Annotated[str | None, Cli(("--profile", "-p"))] = Field(
        None, description="profile (e.g. a `moment scan` output) to write measured overrides into")
    out: Annotated[Path | None, Cli(("--out", "-o"))] = Field(
        None, description="write a measurement file (`moment calibrate --measured`)")
    profile_out: Path | None = Field(
        None, description="write --profile with the measured SSD read rates and memory bandwidth")


def probe(req: ProbeRequest, *, targets: dict[str, str | Path] | None = None, flag: Flag = cli_flag,
          before: Callable[[str, int, int], Any] | None = None) -> dict[str, Any]:
    """Measure the SSDs of `req.ssd_paths` (or `targets`, SSD id -> directory, already checked by the
    caller), the memory and CUDA; write the measurement file and the measured profile the request asks
    for (their paths checked before minutes of measuring). Returns `moment probe --json`'s object."""
    expect(req, ProbeRequest, "moment.probe")
    import yaml

    from moment.io.probe import check_probe, probe_machine
    from moment.topology.model import Topology
    from moment.topology.profiles import dump_yaml, load_profile

    if targets is None:
        targets = parse_ssd_paths(req.ssd_paths) if req.ssd_paths else {"ssd0": "."}
    check_probe(req.size_mib << 20, req.queue_depth, flag=flag)
    _one_disk_each(targets, flag)
    if req.profile_out is not None and req.profile is None:
        raise MomentError("--profile-out needs --profile (the profile to write the measurements into)")
    for path, name in ((req.out, "--out"), (req.profile_out, "--profile-out")):  # before minutes of measuring
        if path is not None:
            check_output(path, name)
    topo = load_profile(req.profile) if req.profile_out is not None else None
    if topo is not None:
        _check_installed(topo, list(targets), req.profile or "", flag)
    result = probe_machine(targets, file_bytes=req.size_mib << 20, queue_depth=req.queue_depth,
                           keep=req.keep_scratch, before=before, flag=flag, label=lambda ssd: _ssd_input(flag, ssd))
    ssd = result["ssd"]
    if req.out is not None:
        doc = {"machine": req.profile, "measurements": [{"device": k, "read_gbps": round(v["seq_read_gbps"], 4)}
                                                        for k, v in ssd.items()], "probe": result}
        atomic_write(req.out, yaml.safe_dump(doc, sort_keys=False), "--out")
    if topo is not None:
        data = topo.model_dump()
        for n in data["nodes"]:
            if n["id"] in ssd and n["kind"] == "ssd":
                n["read_gbps"] = ssd[n["id"]]["seq_read_gbps"]
            if n["kind"] == "socket":
                n["memory_bandwidth_gbps"] = result["memory_copy_gbps"] / 2  # copy = read + write
        atomic_write(req.profile_out, dump_yaml(Topology.model_validate(data), "measured by `moment probe`"),
                     "--profile-out")
    return result


def _one_disk_each(targets: dict[str, str | Path], flag: Flag) -> None:
    """Each SSD id measures a file system of its own: two ids on one (the same directory, or two on one disk) would
    measure one disk twice, and `calibrate` would take its rate as two SSDs' (two distinct measurements)."""
    seen: dict[int, str] = {}
    for ssd, where in targets.items():
        try:
            dev = os.stat(where).st_dev
        except OSError:
            continue  # the measurement names a missing directory itself
        if dev in seen:
            raise MomentError(f"{_ssd_paths(flag)}: {seen[dev]} and {ssd} are on one file system "
                              f"(device {os.major(dev)}:{os.minor(dev)}): one disk would be measured as two SSDs",
                              hint="give each SSD id a directory on that SSD's own file system", field="ssd_paths")
        seen[dev] = ssd


def _ssd_paths(flag: Flag) -> str:
    """How `flag`'s caller names the SSD directories: `--ssd-path` (the CLI's flag, not `--ssd-paths`), a field."""
    return cli_of(ProbeRequest.model_fields["ssd_paths"]).flags[0] if flag is cli_flag else flag("ssd_paths")


def _ssd_input(flag: Flag, ssd: str) -> str:
    """How one SSD's directory was given: `--ssd-path ssd0` on the command line, `ssd_dirs.ssd0` in a request."""
    return f"{_ssd_paths(flag)} {ssd}" if flag is cli_flag else f"{flag('ssd_paths')}.{ssd}"


def _check_installed(topo: Any, ids: list[str], profile: str, flag: Flag) -> None:
    """--profile-out writes each measured rate into the profile's SSD of that id: an id that names no installed
    SSD there is refused before measuring (its rate had nowhere to go and was dropped without a word)."""
    from moment.topology.model import Kind

    installed = [n.id for n in topo.nodes if n.kind == Kind.ssd]
    missing = [i for i in ids if i not in installed]
    if not missing:
        return
    has = (f"its SSDs: {', '.join(installed)}" if installed else
           "it has no installed SSD, only empty slots (a `moment scan` profile of this machine lists its SSDs)")
    raise MomentError(f"{flag('profile_out')}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                      f"{'an SSD' if len(missing) == 1 else 'SSDs'} of profile {topo.name!r}"
                      f"{'' if profile in ('', topo.name) else f' ({profile})'}, so "
                      f"{'its' if len(missing) == 1 else 'their'} measured rate would be written nowhere",
                      hint=f"give each measured SSD its id in the profile; {has}"
                      + ("" if installed else f"; or leave {flag('profile_out')} out and use --out"),
                      field="profile_out")
