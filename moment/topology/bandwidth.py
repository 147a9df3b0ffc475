"""Link bandwidth table.

Every figure is one direction of a full-duplex link, in bytes/second. PCIe rates include the line
encoding (8b/10b for gen 1-2, 128b/130b for gen 3-5, FLIT 242/256 for gen 6) and a protocol
efficiency for TLP/DLLP overhead (~0.86 for 256-byte payloads), which is why PCIe 4.0 x16 comes out
near 27 GB/s rather than the raw 31.5 GB/s. A measured value on a link overrides all of this.
"""

from __future__ import annotations

GB = 1e9
GIB = float(1 << 30)

#: GT/s per lane and encoding efficiency for each PCIe generation.
PCIE_GENERATIONS: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}
#: Fraction of the encoded rate left for payload (TLP headers, DLLPs, flow control).
PCIE_PROTOCOL_EFFICIENCY = 0.86
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)

#: NVLink: bytes/s per link per direction, by generation (V100: gen 2, A100: gen 3, H100: gen 4).
NVLINK_PER_LINK: dict[int, float] = {1: 20 * GB, 2: 25 * GB, 3: 25 * GB, 4: 25 * GB, 5: 50 * GB}

#: UPI/QPI: bytes/s per link per direction by transfer rate in GT/s (2 bytes per transfer).
SOCKET_LINK_BYTES_PER_TRANSFER = 2.0
DEFAULT_UPI_GTS = 11.2
DEFAULT_QPI_GTS = 9.6

#: AMD xGMI (Infinity Fabric between sockets or MI-series GPUs), per link per direction.
XGMI_PER_LINK = 32 * GB


def pcie_lane_bytes(gen: int) -> float:
    """Payload bytes/s of one lane, one direction."""
    if gen not in PCIE_GENERATIONS:
        raise ValueError(f"PCIe generation must be one of {sorted(PCIE_GENERATIONS)}, got {gen}")
    gts, enc = PCIE_GENERATIONS[gen]
    return gts * 1e9 * enc / 8 * PCIE_PROTOCOL_EFFICIENCY


def pcie_wire_bytes(gen: int, width: int) -> float:
    """Bytes/s the lanes carry after line encoding, before protocol overhead: what no measurement can beat."""
    gts, enc = PCIE_GENERATIONS[gen]
    return gts * 1e9 * enc / 8 * width


def pcie_bytes(gen: int, width: int) -> float:
    if width <= 0:
        raise ValueError(f"PCIe width must be positive, got x{width}")
    return pcie_lane_bytes(gen) * width


def pcie_gen_from_gts(gts: float) -> int:
    """The PCIe generation whose per-lane rate is `gts` (e.g. 16.0 -> 4)."""
    best = min(PCIE_GENERATIONS, key=lambda g: abs(PCIE_GENERATIONS[g][0] - gts))
    if abs(PCIE_GENERATIONS[best][0] - gts) > 0.6:
        raise ValueError(f"{gts} GT/s is not a PCIe lane rate")
    return best


def nvlink_bytes(gen: int, count: int) -> float:
    if gen not in NVLINK_PER_LINK:
        raise ValueError(f"NVLink generation must be one of {sorted(NVLINK_PER_LINK)}, got {gen}")
    return NVLINK_PER_LINK[gen] * count


def socket_link_bytes(gts: float, count: int) -> float:
    return gts * 1e9 * SOCKET_LINK_BYTES_PER_TRANSFER * count


def gbps(bytes_per_s: float) -> float:
    """bytes/s -> GB/s (10^9) for people."""
    return bytes_per_s / GB
