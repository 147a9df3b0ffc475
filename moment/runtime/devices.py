"""Which plan GPU each rank serves, and which local device runs it.

The layout records, for each GPU bin, the plan GPU it lives on and that GPU's PCI address (when the
topology had one). Local rank r serves the plan GPUs at positions r, r + L, r + 2L, ... of the layout's
GPU bins (L = local ranks; one each when there are as many ranks as plan GPUs). Its CUDA device is the
one whose PCI address is the plan GPU's, so the rank reading a bin is the GPU the plan put it on; when
the address is unknown, or CUDA cannot tell, the device is chosen by local-rank order and `how` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moment.errors import MomentError

PCI = "pci bus id"
ORDER = "local-rank order"


@dataclass(frozen=True)
class RankDevice:
    local_rank: int
    plan_gpus: tuple[str, ...]  # the plan GPUs whose bins this rank serves
    device_index: int | None  # CUDA device index (None on CPU)
    how: str  # PCI or ORDER, with the reason when ORDER
    pci: str | None = None

    def line(self, device: str) -> str:
        gpus = ", ".join(self.plan_gpus) or "no GPU bin"
        at = f" at {self.pci}" if self.pci and self.how == PCI else ""
        return f"local rank {self.local_rank} serves {gpus} on {device}{at} (matched by {self.how})"


def normalise_pci(addr: str | None) -> str | None:
    """'17:00.0', '0000:17:00.0', '00000000:17:00.0' (nvidia-smi) -> '0000:17:00.0'."""
    if not addr:
        return None
    parts = addr.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    dom, bus, devfn = parts
    try:
        return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{devfn}"
    except ValueError:
        return None


def plan_gpus_of(local_rank: int, local_world_size: int, gpu_bins: Sequence[str]) -> tuple[str, ...]:
    """The GPU bins local rank `local_rank` serves (in layout order)."""
    lws = max(1, local_world_size)
    return tuple(b for j, b in enumerate(gpu_bins) if j % lws == local_rank % lws)


def check_local_ranks(local_ranks: int, plan_gpus: Sequence[str], what: str) -> None:
    """Refuse more ranks on a machine than the layout has plan GPUs (GPU bins): the bins are the plan's
    GPUs, so a rank beyond them has no GPU of the plan to stand for. Fewer ranks than plan GPUs is fine:
    a rank then serves several bins. `what` names where the rank count came from (a flag, torchrun's)."""
    if plan_gpus and local_ranks > len(plan_gpus):
        n = len(plan_gpus)
        raise MomentError(f"{what}: {local_ranks} ranks on this machine, but the layout was placed for {n} "
                          f"GPU(s) ({', '.join(plan_gpus)}), one rank per GPU at most",
                          hint=f"run {n} rank(s) or fewer, or place the data again for {local_ranks} GPUs "
                               f"(`moment place --gpus {local_ranks}`)")


def assign(local_rank: int, local_world_size: int, gpu_bins: Sequence[tuple[str, str | None]],
           cuda_pci: Sequence[str | None] | None) -> RankDevice:
    """This rank's plan GPUs and device. `gpu_bins`: (plan GPU, PCI address or None) in layout order;
    `cuda_pci`: the PCI address of each visible CUDA device (None: no CUDA, run on CPU)."""
    mine = plan_gpus_of(local_rank, local_world_size, [g for g, _ in gpu_bins])
    if cuda_pci is None:
        return RankDevice(local_rank, mine, None, f"{ORDER} (no CUDA device)")
    if not cuda_pci:
        raise ValueError("CUDA reports no device")
    fallback = local_rank % len(cuda_pci)
    pci = dict(gpu_bins)
    wanted = {normalise_pci(pci[g]) for g in mine} - {None}
    if len(mine) != 1:
        why = "this rank serves several plan GPUs" if mine else "the layout has no GPU bin for this rank"
        return RankDevice(local_rank, mine, fallback, f"{ORDER} ({why})")
    if not wanted:
        return RankDevice(local_rank, mine, fallback, f"{ORDER} (the plan has no PCI address for {mine[0]})")
    (addr,) = wanted
    visible = [normalise_pci(p) for p in cuda_pci]
    if addr not in visible:
        return RankDevice(local_rank, mine, fallback,
                          f"{ORDER} ({mine[0]}'s address {addr} is not among this machine's CUDA devices)")
    return RankDevice(local_rank, mine, visible.index(addr), PCI, addr)


def cuda_pci_addresses() -> list[str | None] | None:
    """PCI address of each visible CUDA device, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        dom, bus, dev = (getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        out.append(None if bus is None else f"{dom or 0:04x}:{bus:02x}:{dev or 0:02x}.0")
    return out
