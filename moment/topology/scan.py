"""`moment scan`: merge what this machine (or a set of saved outputs) can tell into one Topology.

Sources, and what each adds:
  sysfs           the PCI tree, classes, link speeds/widths, NUMA nodes (always, no root needed)
  lspci -tv/-vvv  device names (sysfs has only ids) and, from saved files, the whole tree
  numactl / sysfs memory per NUMA node (socket)
  dmidecode       slot names, physical widths, empty slots (needs root)
  nvidia-smi      NVLink between GPUs, GPU NUMA affinity
  udev (pyudev)   NVMe block device names and capacities
Whatever is missing or fails is listed in the report with the reason; only the PCI tree is required.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from moment.errors import MomentError
from moment.topology.model import Topology
from moment.topology.readers import console, numa, sysfs, udev
from moment.topology.readers import dmidecode as _dmi
from moment.topology.readers import lspci as _lspci
from moment.topology.readers import nvidia_smi as _smi
from moment.topology.readers.pci import PciFunction, build_topology, classify

Runner = Callable[[list[str]], tuple[int, str, str]]


class MissingSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str
    reason: str


class ScanReport(BaseModel):
    """What a scan used, what it could not use and why, and what it had to assume."""

    model_config = ConfigDict(extra="forbid")

    sources_used: list[str] = Field(default_factory=list)
    sources_missing: list[MissingSource] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def used(self, source: str) -> None:
        self.sources_used.append(source)

    def missing(self, source: str, reason: str) -> None:
        self.sources_missing.append(MissingSource(source=source, reason=reason))

    def lines(self) -> list[str]:
        out = [f"used: {s}" for s in self.sources_used]
        out += [f"missing: {m.source} ({m.reason})" for m in self.sources_missing]
        out += [f"warning: {w}" for w in self.warnings]
        return out


def _run(cmd: list[str]) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, errors="replace", check=False)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after 30 s"
    except OSError as e:
        return 127, "", e.strerror or str(e)
    return p.returncode, p.stdout, p.stderr


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:160] if lines else "no output"


def _tool(cmd: list[str], what: str, report: ScanReport, run: Runner, which: Callable[[str], str | None]) -> str | None:
    if which(cmd[0]) is None:
        report.missing(what, f"`{cmd[0]}` is not installed")
        return None
    rc, out, err = run(cmd)
    if rc != 0:
        report.missing(what, f"`{' '.join(cmd)}` failed (exit {rc}): {_first_line(err or out)}")
        return None
    return out


def _gpu_numa_from_matrix(funcs: list[PciFunction], matrix: _smi.TopoMatrix, report: ScanReport) -> None:
    """Give GPUs without a NUMA node the one nvidia-smi shows (GPUs matched in bus order)."""
    gpus = sorted((f for f in funcs if classify(f) is not None and classify(f).value == "gpu"), key=lambda f: f.key)
    if len(gpus) != len(matrix.gpus):
        return
    for f, g in zip(gpus, matrix.gpus):
        if f.numa is None and matrix.numa_affinity.get(g) is not None:
            f.numa = matrix.numa_affinity[g]


def _finish(topo: Topology, matrix: _smi.TopoMatrix | None, slots: list | None, report: ScanReport,
            pci_scanned: bool = True, cpu: str | None = None) -> Topology:
    if slots:
        topo = _dmi.merge_slots(topo, slots, warnings=report.warnings, pci_scanned=pci_scanned, cpu=cpu)
    if matrix is not None:
        try:
            topo = _smi.apply_nvlinks(topo, matrix, warnings=report.warnings)
        except MomentError as e:
            report.warnings.append(f"NVLinks not added: {e}")
    return topo


def scan_local(name: str | None = None, *, sysfs_root: str | Path = sysfs.DEFAULT_ROOT,
               node_root: str | Path = "/sys/devices/system/node", run: Runner = _run,
               which: Callable[[str], str | None] = shutil.which, use_udev: bool = True) -> tuple[Topology, ScanReport]:
    """Scan this machine. `run`/`which`/roots are parameters so tests can fake the machine."""
    report = ScanReport()
    name = name or socket.gethostname() or "this-machine"
    funcs = sysfs.read_functions(sysfs_root)
    report.used(f"sysfs ({sysfs_root}, {len(funcs)} PCI functions)")
    tree = _tool(["lspci", "-tv"], "lspci -tv", report, run, which)
    if tree is not None:
        try:
            funcs = _lspci.merge(funcs, _lspci.parse_tree(tree, "lspci -tv"))
            report.used("lspci -tv (device names)")
        except MomentError as e:
            report.missing("lspci -tv", f"unreadable output: {e}")
    verbose = _tool(["lspci", "-vvv"], "lspci -vvv", report, run, which) if tree is not None else None
    if verbose is not None:
        try:
            funcs = _lspci.merge(funcs, _lspci.parse_verbose(verbose, "lspci -vvv"))
            report.used("lspci -vvv (slot capability, physical slots)")
        except MomentError as e:
            report.missing("lspci -vvv", f"unreadable output: {e}")
    memory = numa.sysfs_nodes(node_root)
    if memory:
        report.used(f"sysfs NUMA nodes ({len(memory)})")
    matrix = None
    smi = _tool(["nvidia-smi", "topo", "-m"], "nvidia-smi topo -m", report, run, which)
    if smi is not None:
        try:
            matrix = _smi.parse_topo(smi, "nvidia-smi topo -m")
            report.used(f"nvidia-smi topo -m ({len(matrix.gpus)} GPUs)")
            _gpu_numa_from_matrix(funcs, matrix, report)
        except MomentError as e:
            report.missing("nvidia-smi topo -m", f"unreadable output: {e}")
    topo = build_topology(funcs, name=name, source="scan of this machine", memory_gib=memory or None,
                          sockets=len(memory) or None, warnings=report.warnings)
    slots = None
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        report.missing("dmidecode -t slot", "needs root (run `sudo moment scan` for slot names and empty slots)")
    else:
        out = _tool(["dmidecode", "-t", "slot"], "dmidecode -t slot", report, run, which)
        if out is not None:
            try:
                slots = _dmi.parse_slots(out, "dmidecode -t slot")
                report.used(f"dmidecode -t slot ({len(slots)} slot records)")
                if not slots:
                    report.warnings.append("dmidecode lists no slots (a VM or a BIOS without SMBIOS type 9)")
            except MomentError as e:
                report.missing("dmidecode -t slot", f"unreadable output: {e}")
    topo = _finish(topo, matrix, slots, report)
    if use_udev:
        ok, why = udev.available()
        if not ok:
            report.missing("udev", why)
        else:
            try:
                devs = udev.enumerate_devices()
                topo = udev.annotate(topo, devs)
                report.used(f"udev ({sum(d.kind == 'nvme' for d in devs)} NVMe disks, "
                            f"{sum(d.kind == 'gpu' for d in devs)} GPU cards)")
            except Exception as e:  # noqa: BLE001 - udev trouble must not sink a scan; it is reported
                report.missing("udev", f"enumeration failed: {e}")
    return topo, report


def _load(path: str | Path | console.Given | None) -> tuple[str, str] | None:
    if path is None:
        return None
    return console.read_text(path), path.source if isinstance(path, console.Given) else str(path)


def _check_dmidecode(text: str, source: str, slots: list, *, alone: bool) -> None:
    """A dmidecode file with no slot records is a wrong file (or a machine without SMBIOS slots, which
    is only an error when nothing else describes the machine)."""
    if slots:
        return
    if not _dmi.looks_like_dmidecode(text):
        raise MomentError("not dmidecode output: no DMI records (\"Handle 0x..., DMI type ...\") found",
                          source=source, hint="save the output of `sudo dmidecode -t slot`")
    if alone:
        raise MomentError("no slots found: the dmidecode output has no \"System Slot Information\" records",
                          source=source, hint="a VM or a BIOS without SMBIOS type 9; give lspci output too")


Saved = str | Path | console.Given


def scan_files(lspci: Saved | None = None, lspci_vvv: Saved | None = None,
               dmidecode: Saved | None = None, nvidia_smi: Saved | None = None, *,
               name: str | None = None) -> tuple[Topology, ScanReport]:
    """A Topology from saved command outputs (any subset; a Markdown/console log may hold several; a
    `console.Given` is output read already, such as standard input)."""
    files = {k: _load(v) for k, v in (("lspci", lspci), ("lspci_vvv", lspci_vvv), ("dmidecode", dmidecode),
                                      ("nvidia_smi", nvidia_smi))}
    if not any(files.values()):
        raise MomentError("scan_files needs at least one of lspci, lspci_vvv, dmidecode, nvidia_smi")
    report = ScanReport()
    first = next(v for v in (lspci, lspci_vvv, nvidia_smi, dmidecode) if v)
    name = name or ("stdin" if isinstance(first, console.Given) else Path(first).stem)
    memory: dict[int, float] = {}
    for loaded in files.values():
        if loaded and (m := numa.parse_numactl(loaded[0])):
            memory = m
            report.used(f"numactl --hardware in {loaded[1]} ({len(m)} NUMA nodes)")
            break
    matrix = slots = sockets = cpu = None
    if files["nvidia_smi"]:
        matrix = _smi.parse_topo(*files["nvidia_smi"])
        report.used(f"nvidia-smi topo -m: {files['nvidia_smi'][1]} ({len(matrix.gpus)} GPUs)")
    if files["dmidecode"]:
        slots = _dmi.parse_slots(*files["dmidecode"])
        sockets = _dmi.count_sockets(files["dmidecode"][0])
        cpu = _dmi.cpu_model(files["dmidecode"][0])
        _check_dmidecode(*files["dmidecode"], slots, alone=not any(files[k] for k in ("lspci", "lspci_vvv",
                                                                                      "nvidia_smi")))
        report.used(f"dmidecode: {files['dmidecode'][1]} ({len(slots)} slot records)")
    funcs: list[PciFunction] = []
    if files["lspci"]:
        text, src = files["lspci"]
        funcs = _lspci.parse_tree(text, src)
        report.used(f"lspci -tv: {src}")
        if not files["lspci_vvv"] and console.has_prompts(text) and any(
                s.command and console.is_lspci_verbose(s.command) for s in console.sections(text)):
            files["lspci_vvv"] = files["lspci"]
    if files["lspci_vvv"]:
        text, src = files["lspci_vvv"]
        funcs = _lspci.merge(funcs, _lspci.parse_verbose(text, src))
        report.used(f"lspci -vvv: {src}")
    else:
        report.missing("lspci -vvv", "not given: link speeds/widths and NUMA nodes are assumed")
    sources = " + ".join(s for s in report.sources_used)
    if funcs:
        if matrix is not None:
            _gpu_numa_from_matrix(funcs, matrix, report)
        if sockets is None and memory:
            sockets = len(memory)
        topo = build_topology(funcs, name=name, source=sources, sockets=sockets, memory_gib=memory or None,
                              warnings=report.warnings)
        return _finish(topo, matrix, slots, report, cpu=cpu), report
    report.missing("lspci -tv", "not given: the PCIe tree is coarse")
    if matrix is not None:
        topo = _smi.topology_from_matrix(matrix, name=name, source=sources, warnings=report.warnings)
        return _finish(topo, None, slots, report, pci_scanned=False, cpu=cpu), report
    assert slots is not None
    return _dmi.topology_from_slots(slots, name=name, sockets=sockets, source=sources, warnings=report.warnings,
                                   cpu=cpu), report
