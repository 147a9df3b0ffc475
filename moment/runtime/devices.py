"""Which plan GPU each rank serves, and which local device runs it.

The layout records, for each GPU bin, the plan GPU it lives on and that GPU's PCI address (when the
topology had one). Local rank r serves the plan GPUs at positions r, r + L, r + 2L, ... of the layout's
GPU bins (L = local ranks; one each when there are as many ranks as plan GPUs). Its CUDA device is the
one whose PCI address is the plan GPU's, so the rank reading a bin is the GPU the plan put it on; when
the address is unknown, or CUDA cannot tell, the device is chosen by local-rank order and `how` says so.

Why the whole machine's map at once (`rank_devices`): two ranks on one GPU make NCCL refuse the run
("Duplicate GPU detected"), and a rank choosing alone cannot see which device another rank's address
match took. Every rank and the launcher compute the same map from the same inputs, so a machine with
fewer GPUs than ranks is refused once, before any rank starts, and no device is given twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moment.errors import MomentError
from moment.io.device import no_gpu_driver

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

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


def rank_devices(local_ranks: int, gpu_bins: Sequence[tuple[str, str | None]],
                 cuda_pci: Sequence[str | None] | None, what: str) -> tuple[RankDevice, ...]:
    """Every local rank's plan GPUs and device, indexed by local rank: PCI-address matches first, then the
    other ranks take the devices left, in local-rank and device order; no GPU twice. `gpu_bins`: (plan GPU,
    PCI address or None) in layout order; `cuda_pci`: each visible CUDA device's PCI address (None: no
    CUDA, run on CPU); `what` names where the rank count came from (a flag, torchrun's)."""
    mine = [plan_gpus_of(r, local_ranks, [g for g, _ in gpu_bins]) for r in range(local_ranks)]
    if cuda_pci is None:
        return tuple(RankDevice(r, m, None, f"{ORDER} (no CUDA device)") for r, m in enumerate(mine))
    visible = [normalise_pci(p) for p in cuda_pci]
    _check_count(local_ranks, visible, what)
    taken: dict[int, int] = {}  # device index -> local rank, in the order they were taken
    why: dict[int, str] = {}  # local rank -> why it was not matched by address
    for r, m in enumerate(mine):
        got = _match(m, dict(gpu_bins), visible, taken)
        if isinstance(got, str):
            why[r] = got
        else:
            taken[got] = r
    for r in why:
        taken[_next_free(r, visible, taken, what)] = r
    by_rank = {r: i for i, r in taken.items()}
    return tuple(RankDevice(r, m, by_rank[r], PCI, visible[by_rank[r]]) if r not in why
                 else RankDevice(r, m, by_rank[r], f"{ORDER} ({why[r]})") for r, m in enumerate(mine))


def _check_count(local_ranks: int, visible: Sequence[str | None], what: str) -> None:
    """One rank per visible device at most: NCCL refuses two ranks on one GPU."""
    if local_ranks > len(visible):
        n = len(visible)
        seen = ", ".join(f"cuda:{i}" + (f" at {a}" if a else "") for i, a in enumerate(visible)) or "none"
        raise MomentError(f"{what}: {local_ranks} ranks on this machine, but CUDA sees {n} device(s) ({seen}), "
                          "one rank per GPU at most",
                          hint=f"run {n} rank(s) or fewer, or make more GPUs visible (CUDA_VISIBLE_DEVICES)")


def _holder(i: int, visible: Sequence[str | None], taken: dict[int, int]) -> int | None:
    """The device already taken that is device `i`'s GPU: itself, or one at the same PCI address (the same
    GPU listed twice, which NCCL also refuses)."""
    return next((j for j in taken if j == i or (visible[i] is not None and visible[j] == visible[i])), None)


def _match(gpus: tuple[str, ...], pci: dict[str, str | None], visible: Sequence[str | None],
           taken: dict[int, int]) -> int | str:
    """The free device at the address of the one plan GPU a rank serves, or why there is none."""
    if len(gpus) != 1:
        return "this rank serves several plan GPUs" if gpus else "the layout has no GPU bin for this rank"
    (gpu,) = gpus
    addr = normalise_pci(pci[gpu])
    if addr is None:
        return f"the plan has no PCI address for {gpu}"
    at = [i for i, a in enumerate(visible) if a == addr]
    if not at:
        return f"{gpu}'s address {addr} is not among this machine's CUDA devices"
    held = _holder(at[0], visible, taken)
    if held is not None:
        return f"{gpu}'s address {addr} is local rank {taken[held]}'s device already"
    return at[0]


def _next_free(rank: int, visible: Sequence[str | None], taken: dict[int, int], what: str) -> int:
    """The first device nobody has taken, for a rank not matched by address; refuses when every device left
    is a GPU another rank has (listed twice)."""
    for i in range(len(visible)):
        if _holder(i, visible, taken) is None:
            return i
    i = min(set(range(len(visible))) - set(taken))  # there is one: no more ranks than devices
    j = _holder(i, visible, taken)
    raise MomentError(f"{what}: local ranks {taken[j]} and {rank} would share one GPU: cuda:{j} and cuda:{i} are "
                      f"both at {visible[i]}, and NCCL refuses a GPU twice",
                      hint="make each GPU visible once (CUDA_VISIBLE_DEVICES), or run fewer ranks")


def local_devices(device: str, local_ranks: int, gpu_bins: Sequence[tuple[str, str | None]],
                  what: str) -> tuple[RankDevice, ...]:
    """This machine's rank -> device map for a run on `device` ("cpu" or "cuda"), as every rank and the
    launcher compute it: the launcher refuses a bad one before torchrun starts any rank."""
    check_local_ranks(local_ranks, [g for g, _ in gpu_bins], what)
    if device != "cuda":
        return rank_devices(local_ranks, gpu_bins, None, what)
    cuda_pci = cuda_pci_addresses()
    if cuda_pci is None:
        raise MomentError("--device cuda requested but CUDA is not available")
    return rank_devices(local_ranks, gpu_bins, cuda_pci, what)


def cuda_available() -> bool:
    """Whether torch sees a CUDA device; on a machine without a GPU driver, no, without importing torch
    (seconds of start-up in a launcher that needs no tensor)."""
    if no_gpu_driver():
        return False
    import torch

    return torch.cuda.is_available()


def default_device(device: str | None) -> str:
    """--device, else cuda where torch sees a CUDA device, else cpu."""
    return device or ("cuda" if cuda_available() else "cpu")


def cuda_pci_addresses() -> list[str | None] | None:
    """PCI address of each visible CUDA device, or None without CUDA."""
    if not cuda_available():
        return None
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        dom, bus, dev = (getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        out.append(None if bus is None else f"{dom or 0:04x}:{bus:02x}:{dev or 0:02x}.0")
    return out
