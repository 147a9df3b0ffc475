"""`moment scan` (this machine or saved files) and `moment export` (YAML, JSON, NCCL topology XML)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from moment.cli import app, console, err_console
from moment.errors import MomentError
from moment.outputs import atomic_write, check_output

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def _render_topology(topo) -> None:
    t = Table(title=escape(f"{topo.name}: {topo.description or ''}"), title_justify="left")
    for col in ("id", "kind", "parent", "link", "details"):
        t.add_column(col)
    for n in topo.nodes:
        details = ", ".join(f"{k}={v}" for k, v in (("model", getattr(n, "model", None)), ("pci", n.pci),
                                                        ("label", n.label)) if v)
        t.add_row(escape(n.id), n.kind.value, escape(n.parent or ""), escape(n.link.describe() if n.link else ""),
                  escape(details))
    console.print(t)
    for lk in topo.links:
        console.print(f"peer link {lk.a} <-> {lk.b}: {lk.describe()}" + (f" [{lk.label}]" if lk.label else ""),
                      markup=False)
    counts = topo.counts()
    console.print("counts: " + ", ".join(f"{v} {k}" for k, v in counts.items()))


def _is_stdin(path: Path | None) -> bool:
    return path is not None and str(path) == "-"


def _piped(paths) -> bytes | None:
    """Standard input, read once, when a --from-* option names `-` (options naming it share it)."""
    from moment.inputs import read_stdin

    return read_stdin("saved command output") if any(_is_stdin(p) for p in paths) else None


@app.command("scan")
def scan_cmd(
    from_nccl_xml: Path | None = typer.Option(None, "--from-nccl-xml", help="NCCL/RCCL topology XML (NCCL_TOPO_DUMP_FILE output)"),
    from_hwloc_xml: Path | None = typer.Option(None, "--from-hwloc-xml", help="hwloc XML (lstopo --of xml)"),
    from_lspci: Path | None = typer.Option(None, "--from-lspci", help="saved `lspci -tv` output"),
    from_lspci_vvv: Path | None = typer.Option(None, "--from-lspci-vvv", help="saved `lspci -vvv` output (link speeds/widths)"),
    from_dmidecode: Path | None = typer.Option(None, "--from-dmidecode", help="saved `dmidecode` or `dmidecode -t slot` output"),
    from_nvidia_smi: Path | None = typer.Option(None, "--from-nvidia-smi", help="saved `nvidia-smi topo -m` output"),
    name: str | None = typer.Option(None, "--name", help="name of the resulting profile"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write the topology as a YAML profile to this file"),
    json_out: bool = typer.Option(False, "--json", help="print the topology as JSON"),
) -> None:
    """Read a machine's topology: this machine (sysfs, lspci, dmidecode, nvidia-smi, udev) or saved files.

    With no --from-* option, scans this machine and says which sources were missing (dmidecode needs
    root, nvidia-smi needs a driver). The YAML it writes is a profile for `moment plan --profile FILE`.
    A --from-* file may be `-`, standard input (`lspci -tv | moment scan --from-lspci -`); several options
    may name it when one piped log holds several outputs.
    """
    from moment.topology import checks
    from moment.topology.profiles import save_profile

    if out is not None:
        check_output(out, "--out")
    report = None
    text_sources = (from_lspci, from_lspci_vvv, from_dmidecode, from_nvidia_smi)
    chosen = sum(x is not None for x in (from_nccl_xml, from_hwloc_xml)) + (any(text_sources) and 1 or 0)
    if chosen > 1:
        raise MomentError("give one kind of source: --from-nccl-xml, --from-hwloc-xml, or the text outputs "
                          "(--from-lspci/--from-lspci-vvv/--from-dmidecode/--from-nvidia-smi)")
    piped = _piped((from_nccl_xml, from_hwloc_xml, *text_sources))
    if from_nccl_xml:
        from moment.topology.readers.nccl_xml import read_nccl_xml

        topo = read_nccl_xml(piped if _is_stdin(from_nccl_xml) else from_nccl_xml, name=name)
    elif from_hwloc_xml:
        from moment.topology.readers.hwloc_xml import read_hwloc_xml

        topo = read_hwloc_xml(piped if _is_stdin(from_hwloc_xml) else from_hwloc_xml, name=name)
    elif any(text_sources):
        from moment.topology.readers import console as saved
        from moment.topology.scan import scan_files

        given = saved.Given(saved.decode(piped, "standard input")) if piped is not None else None
        lspci, vvv, dmi, smi = (given if _is_stdin(p) else p for p in text_sources)
        topo, report = scan_files(lspci=lspci, lspci_vvv=vvv, dmidecode=dmi, nvidia_smi=smi, name=name)
    else:
        from moment.topology.scan import scan_local

        topo, report = scan_local(name=name)
    if out:
        save_profile(topo, out, header=f"scanned by `moment scan`\nsource: {topo.source or 'this machine'}",
                     what="--out")
    if json_out:
        from moment.planner.api import topology_json

        print(json.dumps(topology_json(topo, report), indent=2))
        return
    _render_topology(topo)
    if report is not None:
        for line in report.lines():
            err_console.print(line)
    for note in checks.notes(topo):  # (what a plan of it will say: a link its CPU caps, more lanes than it has)
        err_console.print(f"note: {note}", markup=False, highlight=False)
    if out:
        console.print(f"profile written to [bold]{escape(str(out))}[/]")


@app.command("export")
def export_cmd(
    profile: str = typer.Option(..., "--profile", "-p", help="profile name or YAML file"),
    fmt: str = typer.Option("yaml", "--format", "-f", help="yaml, json or nccl-xml (for NCCL_TOPO_FILE)"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
    overrides: list[str] = typer.Option([], "--set", help="what-if override PATH=VALUE, repeatable"),
) -> None:
    """Write a profile as YAML, JSON or NCCL topology XML (hand the XML to NCCL_TOPO_FILE)."""
    from moment.topology.profiles import dump_yaml, load_profile

    if out is not None:
        check_output(out, "--out")
    topo = load_profile(profile, overrides)
    if fmt == "yaml":
        text = dump_yaml(topo)
    elif fmt == "json":
        text = json.dumps(topo.model_dump(mode="json", exclude_none=True), indent=2) + "\n"
    elif fmt == "nccl-xml":
        from moment.topology.readers.nccl_xml import write_nccl_xml

        text = write_nccl_xml(topo)
    else:
        raise MomentError(f"--format {fmt!r}: choose yaml, json or nccl-xml")
    if out:
        atomic_write(out, text, "--out")
        console.print(f"written to {escape(str(out))}")
    else:
        print(text, end="")
