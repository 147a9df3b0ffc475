"""`nvidia-smi topo -m`: the GPU/NIC relation matrix, NVLink counts and NUMA affinity.

The matrix is the only text source that shows NVLink (NV12 = a bonded set of 12 links), so its main
use is `apply_nvlinks` on a tree from lspci or sysfs. nvidia-smi numbers GPUs in PCI bus order, so
GPU i is matched to the i-th GPU of the topology by bus address.

When every pair of three or more GPUs shows the same NV#, the GPUs hang off an NVSwitch fabric (HGX
boards): the pairs share each GPU's N links rather than owning N links each, so by default
(`nvswitch="auto"`) that is modelled as an `nvswitch` node with one N-link peer link per GPU;
`nvswitch="never"` gives pairwise links for every pair instead.

On its own (`topology_from_matrix`) the matrix gives a coarse machine: sockets from NUMA affinity
(when it is N/A, from the GPUs' CPU affinities, else from the SYS relation, with a warning; joined by the builder's assumed socket link, `build.socket_mesh`: the matrix names no CPU),
one root complex per group of devices joined by PHB/PXB/PIX (same host bridge), a switch per group
joined by PXB/PIX, every GPU without NVLink and every listed NIC in its own slot (NICs PIX to each other are
kept apart; that they are probably ports of one card is said in their labels and a warning). GPUs
the matrix shows on NVLink are SXM modules soldered to the board, so, as the NCCL reader and the
built-in HGX/DGX profiles keep them, they hang in place without a slot: a plan keeps them and their
NVLinks, and places its devices around them (`--gpus 0`). Links are assumed
PCIe 4.0 x16 (the matrix has no widths), which the returned warnings say.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from moment.errors import MomentError, validation_error
from moment.topology.model import Kind, Topology
from moment.topology.readers import console
from moment.topology.readers import _xml_cpu as cpus
from moment.topology.readers.build import next_slot_id, socket_mesh
from moment.topology.readers.pci import DEFAULT_GEN

_REL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|SOC|PSB|NV\d+|N/A)$")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[A-Za-z]+\d+(?:_\d+)?)$")
_TRAILERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SOC": 3, "SYS": 4, "PSB": 1}


class TopoMatrix(BaseModel):
    """The parsed matrix: `cells[i][j]` is the relation of devices[i] to devices[j]."""

    model_config = ConfigDict(extra="forbid")

    devices: list[str]
    cells: list[list[str]]
    cpu_affinity: dict[str, str] = {}
    numa_affinity: dict[str, int | None] = {}
    nic_names: dict[str, str] = {}
    legend: bool = False

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not d.startswith("GPU")]

    def relation(self, a: str, b: str) -> str:
        return self.cells[self.devices.index(a)][self.devices.index(b)]

    def nvlink_count(self, a: str, b: str) -> int:
        rel = self.relation(a, b)
        return int(rel[2:]) if rel.startswith("NV") else 0


def _second_matrix(lines: list[tuple[int, str]], hno: int) -> int | None:
    """The line of another relation matrix's header after the one at `hno` (a header starts with GPU0 and,
    unlike the GPU0 row, is not followed by a relation); a `topo -p2p` matrix (OK/NS cells) is not one."""
    rows = [(no, ln.split()) for no, ln in lines if no > hno and ln.split()[:1] == ["GPU0"]]
    for i, (no, toks) in enumerate(rows):
        if len(toks) > 1 and _REL.match(toks[1]):
            continue
        row = next((t for _, t in rows[i + 1:] if len(t) > 1 and _REL.match(t[1])), None)
        if row is None or len(row) < 3 or _REL.match(row[2]):
            return no
    return None


def parse_topo(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Parse `nvidia-smi topo -m` (legends optional, any column spacing, ANSI escapes tolerated); a file
    holding two matrices is refused."""
    lines = [(no, ln.rstrip()) for no, ln in console.select(text, console.is_nvidia_topo)]
    head = next(((no, ln) for no, ln in lines if ln.split()[:1] and ln.split()[0] == "GPU0"), None)
    if head is None:
        raise MomentError("no `nvidia-smi topo -m` matrix found (no header line starting with GPU0)",
                          source=source)
    hno, hline = head
    tokens = hline.split()
    devices: list[str] = []
    for tok in tokens:
        if not _DEVICE.match(tok) or tok in ("CPU", "NUMA", "GPU"):
            break
        devices.append(tok)
    if len(set(devices)) != len(devices):
        raise MomentError(f"line {hno}: a device column appears twice", source=source)
    if (again := _second_matrix(lines, hno)) is not None:
        raise MomentError(f"holds two `nvidia-smi topo -m` matrices (header lines {hno} and {again}): two outputs "
                          "in one file", source=source,
                          hint="keep one machine's matrix in the file (`nvidia-smi topo -m > topo.txt`, not >>)")
    trailer_text = hline.split(devices[-1], 1)[1] if devices else ""
    trailers = [t for t in _TRAILERS if t in trailer_text]
    rows: dict[str, list[str]] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, int | None] = {}
    nic_names: dict[str, str] = {}
    legend = False
    after = [(no, ln) for no, ln in lines if no > hno]
    in_matrix = True
    for no, ln in after:
        toks = ln.split()
        if not toks:
            in_matrix = False
            continue
        if toks[0].rstrip(":") in ("Legend", "NIC"):
            legend = True
            in_matrix = False
        if m := re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", ln):
            nic_names[m.group(1)] = m.group(2)
            continue
        if not in_matrix or toks[0] not in devices:
            continue
        label, rels, rest = toks[0], toks[1:len(devices) + 1], toks[len(devices) + 1:]
        if label in rows:
            raise MomentError(f"line {no}: row {label} appears twice", source=source)
        if len(rels) < len(devices):
            raise MomentError(f"line {no}: row {label} has {len(rels)} of {len(devices)} columns", source=source)
        for j, r in enumerate(rels):
            if not _REL.match(r):
                raise MomentError(f"line {no}: {label} vs {devices[j]}: unknown relation {r!r}", source=source,
                                  hint="expected X, SYS, NODE, PHB, PXB, PIX or NV<count>")
        rows[label] = rels
        for name, value in zip(trailers, rest):
            if name == "CPU Affinity":
                cpu[label] = value
            elif name == "NUMA Affinity":
                numa[label] = int(value) if value.isdigit() else None
    missing = [d for d in devices if d not in rows]
    if missing:
        raise MomentError(f"matrix rows missing for {', '.join(missing)}", source=source)
    cells = [rows[d] for d in devices]
    for i, d in enumerate(devices):
        if cells[i][i] != "X":
            raise MomentError(f"row {d}: the diagonal should be X, found {cells[i][i]!r}", source=source)
    if not any(d.startswith("GPU") for d in devices):
        raise MomentError("the matrix has no GPU columns", source=source)
    return TopoMatrix(devices=devices, cells=cells, cpu_affinity=cpu, numa_affinity=numa, nic_names=nic_names,
                      legend=legend)


def read_nvidia_smi(path: str | Path) -> TopoMatrix:
    return parse_topo(console.read_text(path), str(path))


def nvlink_gen(model: str) -> int | None:
    """NVLink generation from a GPU model name (V100: 2, A100: 3, H100/H200: 4, B200: 5)."""
    low = model.lower()
    for pattern, gen in (("b100|b200|gb200", 5), ("h100|h200|h800|gh200", 4), ("a100|a800", 3), ("v100", 2)):
        if re.search(pattern, low):
            return gen
    return None


def _fabric(matrix: TopoMatrix) -> int | None:
    """NV# if every GPU pair shows the same NV# (three or more GPUs): an NVSwitch fabric."""
    g = matrix.gpus
    counts = {matrix.nvlink_count(a, b) for i, a in enumerate(g) for b in g[i + 1:]}
    return counts.pop() if len(g) >= 3 and len(counts) == 1 and 0 not in counts else None


def apply_nvlinks(topo: Topology, matrix: TopoMatrix, *, nvswitch: str = "auto",
                  warnings: list[str] | None = None) -> Topology:
    """A copy of `topo` with NVLink peer links between its GPUs (matched in bus order)."""
    if nvswitch not in ("auto", "never"):
        raise MomentError(f"nvswitch must be 'auto' or 'never', got {nvswitch!r}")
    gpus = sorted(topo.of_kind(Kind.gpu), key=lambda n: (n.pci is None, n.pci or "", n.id))
    if len(gpus) != len(matrix.gpus):
        raise MomentError(f"nvidia-smi shows {len(matrix.gpus)} GPUs but the topology has {len(gpus)}",
                          hint="use nvidia-smi output from the same machine as the PCI scan")
    ids = dict(zip(matrix.gpus, (g.id for g in gpus)))
    gen = next((nvlink_gen(getattr(g, "model", "") or g.label or "") for g in gpus), None)
    data = topo.model_dump(exclude_none=True)
    links = [lk for lk in data.get("links", []) if lk["kind"] != "nvlink"]
    fabric = _fabric(matrix) if nvswitch == "auto" else None
    if fabric:
        taken = {n["id"] for n in data["nodes"]}
        i = 0
        while f"nvswitch{i}" in taken:
            i += 1
        sw_id = f"nvswitch{i}"
        data["nodes"].append({"id": sw_id, "kind": "nvswitch", "parent": topo.of_kind(Kind.socket)[0].id,
                              "label": f"NVLink fabric (every GPU pair NV{fabric} in nvidia-smi)"})
        for g in matrix.gpus:
            links.append({"a": ids[g], "b": sw_id, "kind": "nvlink", "count": fabric, "gen": gen,
                          "label": f"NV{fabric}"})
        if warnings is not None:
            warnings.append(f"all GPU pairs show NV{fabric}: modelled as an NVSwitch fabric ({sw_id}), each GPU "
                            f"with {fabric} links to it")
    else:
        g = matrix.gpus
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                n = matrix.nvlink_count(a, b)
                if n:
                    links.append({"a": ids[a], "b": ids[b], "kind": "nvlink", "count": n, "gen": gen,
                                  "label": f"NV{n}"})
    data["links"] = [{k: v for k, v in lk.items() if v is not None} for lk in links]
    try:
        return Topology.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, "could not add NVLinks", limit=1) from None


def _groups(items: list[str], joined) -> list[list[str]]:
    """Connected groups of `items` under the symmetric relation `joined`, in first-item order."""
    parent = {x: x for x in items}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if joined(a, b):
                parent[find(b)] = find(a)
    out: dict[str, list[str]] = {}
    for x in items:
        out.setdefault(find(x), []).append(x)
    return list(out.values())


def _cpu_set(text: str | None) -> frozenset[int] | None:
    """The CPUs of a "CPU Affinity" cell ("0-31,64-95"); None for N/A or anything else."""
    out: set[int] = set()
    for part in (text or "").split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out) or None


def _gpu_sockets(matrix: TopoMatrix, warnings: list[str] | None) -> tuple[dict[str, int], bool]:
    """Each GPU's socket key and whether the keys are NUMA nodes. NUMA affinity when every GPU has one;
    otherwise (N/A: node interleaving, VMs) GPUs whose CPU affinities overlap share a socket, or, without
    CPU affinities, GPUs not SYS to each other (SYS crosses the socket link), said in a warning."""
    g = matrix.gpus
    numa = {x: matrix.numa_affinity.get(x) for x in g}
    if all(v is not None for v in numa.values()):
        return {x: v for x, v in numa.items() if v is not None}, True
    cpu = {x: _cpu_set(matrix.cpu_affinity.get(x)) for x in g}
    if all(c is not None for c in cpu.values()):
        groups = _groups(g, lambda a, b: bool(cpu[a] & cpu[b]))
        how = "GPUs whose CPU affinities overlap share a socket"
    else:
        groups = _groups(g, lambda a, b: matrix.relation(a, b) != "SYS")
        how = "GPUs not SYS to each other share a socket"
    if len(groups) > 1 and warnings is not None:
        shown = "; ".join(f"cpu{i}: {', '.join(grp)}" for i, grp in enumerate(groups))
        warnings.append(f"nvidia-smi: NUMA affinity is N/A, so sockets are inferred: {how} ({shown})")
    elif any(matrix.relation(a, b) == "SYS" for i, a in enumerate(g) for b in g[i + 1:]) and warnings is not None:
        warnings.append("nvidia-smi: NUMA affinity is N/A and the CPU affinities do not separate the GPUs, "
                        "though some pairs are SYS (across the socket link): all put under one socket")
    return {x: i for i, grp in enumerate(groups) for x in grp}, False


def topology_from_matrix(matrix: TopoMatrix, *, name: str = "nvidia-smi", source: str | None = None,
                         nvswitch: str = "auto", warnings: list[str] | None = None) -> Topology:
    """A coarse Topology from the matrix alone (see the module docstring for the rules)."""
    rel = matrix.relation
    near = {"PIX", "PXB", "PSB"}
    # one node per listed NIC; NICs PIX to each other are probably ports of one card: said, not merged
    cards = {n: c for c in _groups(matrix.nics, lambda a, b: rel(a, b) == "PIX") if len(c) > 1 for n in c}
    units = [[g] for g in matrix.gpus] + [[n] for n in matrix.nics]  # a unit goes in one slot

    def unit_rel(u: list[str], v: list[str]) -> str:
        return min((rel(a, b) for a in u for b in v), key=lambda r: _RANK.get(r, 3) if not r.startswith("NV") else 5)

    gpu_numa, numa_known = _gpu_sockets(matrix, warnings)
    numas = sorted(set(gpu_numa.values()))

    def numa_of(u: list[str]) -> int:
        if u[0] in gpu_numa:
            return gpu_numa[u[0]]
        best = min(matrix.gpus, key=lambda g: (_RANK.get(unit_rel(u, [g]), 5), g))
        if unit_rel(u, [best]) == "SYS" and len(numas) == 2:
            return numas[1 - numas.index(gpu_numa[best])]
        return gpu_numa[best]

    soldered = {g for g in matrix.gpus if any(matrix.nvlink_count(g, h) for h in matrix.gpus if h != g)}
    keys = [tuple(u) for u in units]
    by_key = {tuple(u): u for u in units}
    rc_groups = _groups(keys, lambda a, b: _RANK.get(unit_rel(by_key[a], by_key[b]), 5) <= 2)
    nodes: list[dict] = [{"id": f"cpu{i}", "kind": "socket", "numa": n if numa_known else None}
                         for i, n in enumerate(numas)]
    sock = {n: f"cpu{i}" for i, n in enumerate(numas)}
    counters = {"sw": 0, "nic": 0}
    link = {"gen": DEFAULT_GEN, "width": 16}
    for r, group in enumerate(rc_groups):
        rc_id = f"rc{r}"
        nodes.append({"id": rc_id, "kind": "root_complex", "parent": sock[numa_of(by_key[group[0]])],
                      "label": "PCIe host bridge (from nvidia-smi)"})
        for sub in _groups(group, lambda a, b: unit_rel(by_key[a], by_key[b]) in near):
            parent = rc_id
            if len(sub) > 1:
                parent = f"sw{counters['sw']}"
                counters["sw"] += 1
                nodes.append({"id": parent, "kind": "switch", "parent": rc_id, "link": link,
                              "label": "PCIe switch (PIX/PXB in nvidia-smi)"})
            for key in sub:
                u = by_key[key]
                if u[0] in soldered:  # an SXM module: on the board, not in a slot (the builder's `fixed`)
                    nodes.append({"id": f"gpu{u[0][3:]}", "kind": "gpu", "parent": parent, "link": link,
                                  "label": f"{u[0]} (NVLink: SXM module, not in a slot)"})
                    continue
                slot = next_slot_id(parent, {n["id"] for n in nodes})
                nodes.append({"id": slot, "kind": "slot", "parent": parent, "width": 16, "link": link})
                if u[0].startswith("GPU"):
                    nodes.append({"id": f"gpu{u[0][3:]}", "kind": "gpu", "parent": slot, "link": link,
                                  "label": u[0]})
                else:
                    label = f"{u[0]} ({matrix.nic_names[u[0]]})" if u[0] in matrix.nic_names else u[0]
                    if u[0] in cards:
                        others = ", ".join(n for n in cards[u[0]] if n != u[0])
                        label += f"; PIX to {others}: probably ports of one card (inferred, kept apart)"
                    nodes.append({"id": f"nic{counters['nic']}", "kind": "nic", "parent": slot, "link": link,
                                  "label": label})
                    counters["nic"] += 1
    if warnings is not None:
        warnings.append(f"nvidia-smi alone: PCIe links assumed PCIe {DEFAULT_GEN}.0 x16; one slot per GPU and per NIC"
                        + (f" ({len(soldered)} GPUs on NVLink are SXM modules, not in slots)" if soldered else ""))
        for c in sorted({tuple(c) for c in cards.values()}):
            warnings.append(f"nvidia-smi: {', '.join(c)} are PIX to each other: probably ports of one card; "
                            "kept as separate NIC nodes under one PCIe switch node")
    try:
        links = socket_mesh([(sock[n], cpus.socket_link(cpus.CpuId())) for n in numas])  # no CPU in the matrix
        topo = Topology.model_validate({"name": name, "source": source, "nodes": nodes, "links": links})
    except ValidationError as e:
        raise validation_error(e, "could not build a topology from the matrix", source=source, limit=1) from None
    return apply_nvlinks(topo, matrix, nvswitch=nvswitch, warnings=warnings)
