"""Recipes for the built-in profiles that come from real topology files.

Each recipe reads a fixture with the XML readers and adds only what the file cannot show (empty NVMe
bays, memory bandwidth), so `topology_profiles/<name>.yaml` can be regenerated and checked against
its source: `write_builtin(name, fixtures_dir, out_dir)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moment.errors import MomentError
from moment.topology.model import Kind, Link, NamedLayout, Slot, Topology
from moment.topology.profiles import save_profile
from moment.topology.readers.hwloc_xml import read_hwloc_xml
from moment.topology.readers.nccl_xml import read_nccl_xml


def _with_bays(topo: Topology, parents: list[str], per_parent: int, gen: int, label: str, description: str,
               source: str, layouts: dict[str, NamedLayout] | None = None, **socket_fields) -> Topology:
    """A copy with `per_parent` empty x4 NVMe bays (accept SSDs only) under each of `parents`."""
    bays = [
        Slot(id=f"{p}-bay{k}", parent=p, width=4, accepts=[Kind.ssd], board="front", label=label,
             link=Link(gen=gen, width=4))
        for p in parents for k in range(per_parent)
    ]
    data = topo.model_dump()
    nodes = []
    for n in topo.nodes:
        d = n.model_dump()
        if n.kind == Kind.socket:
            d.update(socket_fields)
        nodes.append(d)
        nodes.extend(b.model_dump() for b in bays if b.parent == n.id)
    data.update(nodes=nodes, description=description, source=source,
                layouts={k: v.model_dump() for k, v in (layouts or {}).items()})
    return Topology.model_validate(data)


def _gpu_trees(topo: Topology) -> list[str]:
    """Switches that hang straight off a root complex and have GPUs below them, in id order."""
    tops = [n.id for n in topo.of_kind(Kind.switch) if topo.node(n.parent).kind == Kind.root_complex]
    return [s for s in tops if any(s in topo.ancestors(g.id) for g in topo.of_kind(Kind.gpu))]


def _interleave(groups: list[list[str]]) -> list[str]:
    return [b for row in zip(*groups, strict=True) for b in row]


def hgx_a100_8gpu(fixture: Path) -> Topology:
    topo = read_nccl_xml(fixture, name="hgx-a100-8gpu")
    trees = _gpu_trees(topo)
    if len(trees) != 4:
        raise MomentError(f"expected 4 GPU switch trees, found {len(trees)}", source=str(fixture))
    bays = [[f"{t}-bay{k}" for k in range(2)] for t in trees]
    layouts = {
        "bays-spread": NamedLayout(description="SSDs spread round-robin over the four GPU switch trees",
                                   ssd=_interleave(bays)),
        "bays-packed": NamedLayout(description="SSDs filling one switch tree after another",
                                   ssd=[b for tree in bays for b in tree]),
    }
    desc = ("HGX A100 8-GPU (A100-SXM4-80GB, 6 NVSwitches, Ice Lake 2-socket, 5 ConnectX-6 Dx) from a real "
            "NCCL topology dump, plus 8 empty U.2 NVMe bays: 2 on the top PCIe switch of each GPU pair, "
            "as in the DGX-A100 system architecture. GPUs are SXM modules (not movable); SSDs go in the bays.")
    src = ("aliyun/SimAI SimCCL/test/topo_8A100_4CX6.xml @ b35dfe495acb3bc7727a8461db07a3abe9529518 "
           "(NCCL topology dump) + 8 NVMe bays added")
    return _with_bays(topo, trees, 2, 4, "U.2 NVMe bay (added: DGX-A100 architecture)", desc, src, layouts,
                      memory_bandwidth_gbps=170.0)


def dgx2(fixture: Path) -> Topology:
    topo = read_hwloc_xml(fixture, name="dgx2")
    first_rc = [next(c for c in topo.children(s.id) if topo.node(c).kind == Kind.root_complex)
                for s in topo.of_kind(Kind.socket)]
    bays = [[f"{rc}-bay{k}" for k in range(4)] for rc in first_rc]
    layouts = {"bays-spread": NamedLayout(description="SSDs alternating between the two sockets",
                                          ssd=_interleave(bays))}
    desc = ("NVIDIA DGX-2H (16x V100-SXM3-32GB, 12 NVSwitches, 2x Xeon Platinum 8174) from hwloc's test "
            "export, plus 8 empty U.2 NVMe bays, 4 on the first root complex of each socket (position "
            "assumed: the export filtered storage out). GPUs are SXM modules; SSDs go in the bays.")
    src = ("open-mpi/hwloc tests/hwloc/xml/nvidiaDGX2.xml @ 14a4d43397dd0bbd0fcb42e05525fa1e4aa202f9 "
           "(lstopo export) + 8 NVMe bays added")
    return _with_bays(topo, first_rc, 4, 3, "U.2 NVMe bay (added; position assumed)", desc, src, layouts,
                      memory_bandwidth_gbps=110.0)


@dataclass(frozen=True)
class Recipe:
    fixture: str
    build: Callable[[Path], Topology]
    header: str


HGX_HEADER = """\
hgx-a100-8gpu: an 8x A100-SXM4-80GB HGX server with NVSwitch, built from a real NCCL topology dump.

Source: aliyun/SimAI (branch SimCCL), SimCCL/test/topo_8A100_4CX6.xml, commit
b35dfe495acb3bc7727a8461db07a3abe9529518 (Apache-2.0); fixture nccl_simai_8xA100-4xCX6_topo.xml.
Converted with moment.topology.readers.nccl_xml.read_nccl_xml (recipe: moment.topology.builtin_profiles).

Read from the file:
  - 2 sockets (Intel Ice Lake-SP, familyid 6 modelid 106), one root complex each;
  - 20 PCIe bridges -> 20 switches sw0..sw19 (Broadcom PEX88096, 1000:c010), 3 levels deep, all Gen4 x16;
  - 8 GPUs gpu0..gpu7 (10de:20b2 A100-SXM4-80GB: 80 GiB, 2039 GB/s HBM), numbered in bus-id order; they
    are SXM modules, so they are not in slots and the planner never moves them;
  - 5 ConnectX-6 Dx NICs (15b3:101d, mlx5_bond_0..4); nic0 sits on cpu0's root port directly; each NIC is in a slot;
  - 6 NVLinks per GPU, 2 lanes to each of 6 NVSwitches (targets 0000:c0..c5:00.0, class 0x068000) ->
    nvsw0..nvsw5; NVSwitches are only NVLink targets in NCCL files, so they hang on cpu0 with no PCIe link.
Choices (not in the file):
  - ADDED 8 EMPTY NVMe BAYS: 2 per GPU switch tree, as slots of width 4 accepting SSDs only, Gen4 x4,
    board "front", named <switch>-bay0/1, on the top switch of each tree (sw0, sw5, sw10, sw15, the
    switches on the CPU root ports that host both GPUs of a pair). This follows the DGX-A100 system
    architecture, where the U.2 NVMe drives hang off the same PCIe switches as the GPU pairs, so SSD to
    GPU reads stay below the CPU. No empty x16 slots were added.
  - socket link: UPI 3x 11.2 GT/s (Ice Lake-SP default); 256 GiB DRAM per socket (model default; the file
    does not say) at 170 GB/s read (8 channels DDR4-3200, about 83% of 204.8 GB/s peak).
  - layouts bays-spread / bays-packed: reference SSD placements for comparison.
"""

DGX2_HEADER = """\
dgx2: NVIDIA DGX-2H, 16x V100-SXM3-32GB on two baseboards joined by 12 NVSwitches, from hwloc's test XML.

Source: open-mpi/hwloc, tests/hwloc/xml/nvidiaDGX2.xml, commit 14a4d43397dd0bbd0fcb42e05525fa1e4aa202f9
(BSD-3-Clause); fixture hwloc_nvidiaDGX2.xml (an lstopo export filtered to GPU-related I/O).
Converted with moment.topology.readers.hwloc_xml.read_hwloc_xml (recipe: moment.topology.builtin_profiles).

Read from the file:
  - 2 sockets (Xeon Platinum 8174, family 6 model 85), 754.6 / 756.0 GiB local memory; 4 host bridges
    -> rc0..rc3;
  - PLX PEX9781/PEX9797 switch trees (bridges alternate port/switch: 14 switches sw0..sw13), Gen3 x16;
  - 16 GPUs gpu0..gpu15 (10de:1db8), SXM3 modules, so not in slots;
  - 12 NVSwitches nvsw0..nvsw11 behind PEX8725 switches; their management link reads 1.0 GB/s in hwloc,
    which is Gen1 x4 or Gen2 x2 (Gen1 x4 chosen, see the link labels);
  - NVLinkBandwidth matrix: each GPU has one 25 GB/s NVLink 2 to each of 6 NVSwitches (96 links).
Choices (not in the file):
  - ADDED 8 EMPTY NVMe BAYS (the DGX-2 ships 8 U.2 NVMe drives; the export filtered them out): 4 per socket
    on the first root complex of each socket (rc0-bay0..3, rc2-bay0..3), width 4, SSDs only, Gen3 x4,
    board "front". Where they really attach is our assumption; move them with --set if you know better.
  - socket link: UPI 3x 10.4 GT/s (Xeon Platinum 81xx has 3 UPI links); DRAM read bandwidth 110 GB/s per
    socket (6 channels DDR4-2666, about 85% of 128 GB/s peak).
  - layout bays-spread: SSDs alternating between the sockets, for comparison.
"""

RECIPES: dict[str, Recipe] = {
    "hgx-a100-8gpu": Recipe("nccl_simai_8xA100-4xCX6_topo.xml", hgx_a100_8gpu, HGX_HEADER),
    "dgx2": Recipe("hwloc_nvidiaDGX2.xml", dgx2, DGX2_HEADER),
}


def build(name: str, fixtures_dir: Path) -> Topology:
    """The profile from its fixture. Scan evidence (`pci_ids`, `pci_class`) is left out: a built-in
    profile is a reference machine to plan on, not a record of one scan."""
    r = RECIPES[name]
    topo = r.build(Path(fixtures_dir) / r.fixture)
    data = topo.model_dump()
    for n in data["nodes"]:
        n.update(pci_ids=None, pci_class=None)
    return Topology.model_validate(data)


def write_builtin(name: str, fixtures_dir: Path, out_dir: Path) -> Path:
    path = Path(out_dir) / f"{name}.yaml"
    save_profile(build(name, fixtures_dir), path, header=RECIPES[name].header)
    return path
