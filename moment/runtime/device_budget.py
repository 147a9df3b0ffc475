"""A rank's device memory budget: what it holds on its GPU, item by item, and the GPU tier capped to fit.

Why: device memory cannot be paged. A rank that asks its GPU for more than is free fails with an out-of-memory
error mid-epoch, after minutes of start-up, and the GPU tier (the rows of every GPU bin the rank serves) alone
can ask for all of it (four bins at the 25% default are the whole GPU). So each rank states up front what it
holds on its device (CUDA's context and NCCL's buffers, one training step, the batches in flight, the exchange
rounds), refuses when that alone does not fit, and gives the GPU tier only what is left.

The budget is per rank (each rank has its own device) and the same on every rank: the ranks agree on the least
free and total memory among their devices (moment.runtime.train.run_inputs) before the plan is resolved. Pure:
no torch, the device's memory is given (`DeviceMemory`, read by moment.io.device.DeviceLayer.memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moment.errors import MomentError
from moment.io.device import DeviceMemory
from moment.runtime.budget import Item, fmt_bytes, parse_budget
from moment.sizes import parse_size

FLAG = "--device-memory-budget"
#: a CUDA context with torch's kernels, one per process: 0.3-0.5 GiB with lazy module loading (CUDA_MODULE_LOADING=
#: LAZY, the default since CUDA 11.7), 781 MB with every kernel loaded (pytorch/pytorch#34323): the larger, rounded up
CUDA_CONTEXT_BYTES = 768 << 20
#: one NCCL communicator's buffers: NCCL_BUFFSIZE (DEFAULT_BUFFSIZE, 4 MiB, nccl src/init.cc) for each direction
#: of each channel, up to 32 channels (MAXCHANNELS, nccl src/include/device.h): 2 x 32 x 4 MiB
NCCL_COMM_BYTES = 2 * 32 * (4 << 20)
#: the default budget leaves this share of the device's memory free (at least MIN_HEADROOM): the caching
#: allocator's rounding and fragmentation, cuBLAS/cuDNN workspaces and kernels' scratch, which no item states
HEADROOM = 0.05
MIN_HEADROOM = 256 << 20


def headroom(total: int) -> int:
    """What the default budget leaves free of a device of `total` bytes."""
    return max(int(total * HEADROOM), MIN_HEADROOM)


def resolve_device_budget(spec: str | None, memory: DeviceMemory | None) -> tuple[int | None, str]:
    """The per-rank device budget in bytes and where it came from; (None, why) when it cannot be known here
    (`memory` None: the launcher, which opens no CUDA context; each rank reads its device's at start).

    `spec`: bytes (e.g. 40GiB), a share of the device's total memory (e.g. 80%), or auto / None: the device's
    free memory less `headroom`. A budget above the device's free memory is refused: device memory cannot be
    paged, so a run sized for memory that is not free fails mid-epoch instead of now."""
    text = "auto" if spec is None else str(spec).strip()
    if text.lower() == "auto":
        if memory is None:
            return None, "auto: each rank's free device memory less headroom (read at its start)"
        room = headroom(memory.total)
        return max(memory.free - room, 0), (f"auto: the device's free memory {fmt_bytes(memory.free)} less "
                                            f"{fmt_bytes(room)} headroom")
    share = text.endswith("%")
    b = _size(spec, text, memory)
    if memory is None:
        return (None, f"{text} of each rank's device memory (read at its start)") if share else (b, "given")
    if b > memory.free:
        raise MomentError(f"{FLAG} {spec}: {fmt_bytes(b)} is more than the device has free ({fmt_bytes(memory.free)} "
                          f"of {fmt_bytes(memory.total)})",
                          hint=f"give at most {FLAG} {memory.free // 2**20}MiB, or auto (the free memory less "
                               "headroom)")
    return b, f"{text} of the device's {fmt_bytes(memory.total)}" if share else "given"


def _size(spec: str | None, text: str, memory: DeviceMemory | None) -> int:
    """`text` in bytes (a share: of the device's total; without `memory`, in millionths), refused unless it is
    a positive size and a share at most 100%."""
    b = parse_budget(FLAG, text, 10**6 if memory is None else memory.total,
                     "the device's memory (e.g. 80%)", "40GiB")
    if text.endswith("%") and parse_size(text, 10**6) > 10**6:
        raise MomentError(f"{FLAG} {spec}: a share of the device's memory must be at most 100%")
    return b


@dataclass(frozen=True)
class DeviceShape:
    """What a rank's device memory needs depend on: plain numbers, each stated by the component that holds the
    memory (the run plan asks them), so the budget is testable without torch or a GPU."""

    row_bytes: int
    own_gpu_rows: int  # rows of this rank's GPU bins: the most its GPU tier holds
    rows_max: int  # the most rows one batch touches (the batch extent)
    batch_ids_bytes: int  # one batch's ids and edges at the extent (MiniBatch.id_bytes), on the device with it
    held_batches: int  # batches the pipeline holds (Pipeline.held_batches), each on the device
    training_bytes: int  # one training step (moment.runtime.footprint.step_bytes)
    exchange_bytes: int = 0  # one round of the peer exchange (RowExchange.round_bytes); 0: no peer tier
    remote_exchange_bytes: int = 0  # one round of the remote exchange (footprint.remote_round_bytes); 0: none
    communicators: int = 0  # NCCL communicators the rank opens (0: one rank, no process group)


@dataclass
class DeviceBudget:
    """A rank's device budget (None: unknown here, accounted only) and what is charged against it; `gpu_rows`
    of `wanted_rows` is the GPU tier the rest allows."""

    total: int | None
    source: str = ""
    items: list[Item] = field(default_factory=list)
    gpu_rows: int = 0
    wanted_rows: int = 0

    @property
    def used(self) -> int:
        return sum(it.bytes for it in self.items)

    @property
    def capped(self) -> bool:
        """The budget leaves the GPU tier fewer rows than the rank's GPU bins hold."""
        return self.gpu_rows < self.wanted_rows

    def charge(self, name: str, nbytes: int, note: str = "") -> None:
        self.items.append(Item(name, int(max(nbytes, 0)), False, note))

    def check(self) -> None:
        """Refuse when what is charged does not fit, naming the least budget that does."""
        if self.total is not None and self.used > self.total:
            need = -(-self.used // 2**20)
            raise MomentError(
                f"{FLAG} {fmt_bytes(self.total)} ({self.source}) is below the minimum {fmt_bytes(self.used)} a rank "
                f"needs on its device ({self.summary()})",
                hint=f"give at least {FLAG} {need}MiB (on a device with that much free), or fewer rows in flight "
                     "(lower the --batch-size or the fan-outs)")

    def summary(self) -> str:
        return ", ".join(f"{it.name} {fmt_bytes(it.bytes)}" for it in self.items)

    def notice(self) -> str | None:
        """One line when the budget caps the GPU tier (None when it holds every row of the rank's bins)."""
        if not self.capped:
            return None
        return (f"note: the device budget caps each rank's GPU tier at {self.gpu_rows:,} of the {self.wanted_rows:,} "
                "rows of its GPU bins (hottest first); the rest are read through the CPU cache and the SSDs")

    def as_dict(self) -> dict:
        """For the metrics JSON: the budget, its prediction of a rank's device peak and the items."""
        return {"budget_bytes": self.total, "source": self.source, "predicted_peak_bytes": self.used,
                "gpu_rows": self.gpu_rows, "gpu_rows_wanted": self.wanted_rows,
                "items": [{"name": it.name, "bytes": it.bytes, "note": it.note} for it in self.items]}

    def lines(self) -> list[str]:
        """How a rank's device memory is split, for people (printed at start by rank 0)."""
        head = "device memory budget per rank: " + (f"{fmt_bytes(self.total)} ({self.source})" if self.total is not None
                                                     else f"not known here ({self.source})")
        out = [head] + [f"  {it.name:<22} {fmt_bytes(it.bytes):>11}  {it.note}" for it in self.items]
        if self.total is not None:
            out.append(f"  {'unassigned':<22} {fmt_bytes(max(self.total - self.used, 0)):>11}")
        note = self.notice()
        return out + ([note] if note else [])


def device_budget(total: int | None, source: str, r: DeviceShape) -> DeviceBudget:
    """Charge every fixed need of a rank on its device, refuse if they do not fit, then give the GPU tier what
    is left (at most every row of the rank's GPU bins, hottest first)."""
    b = DeviceBudget(total, source)
    b.charge("cuda context", CUDA_CONTEXT_BYTES, "CUDA's context and torch's kernels (CUDA_CONTEXT_BYTES)")
    if r.communicators:
        b.charge("nccl buffers", r.communicators * NCCL_COMM_BYTES,
                 f"{r.communicators} communicator(s) x {fmt_bytes(NCCL_COMM_BYTES)} (NCCL_COMM_BYTES)")
    b.charge("training", r.training_bytes, "one step's activations, gradients and optimizer state")
    per_batch = r.rows_max * r.row_bytes + r.batch_ids_bytes
    b.charge("batches", r.held_batches * per_batch, f"{r.held_batches} batches of {r.rows_max:,} rows, with ids "
                                                    "and edges")
    if r.own_gpu_rows:
        b.charge("gpu tier gather", r.rows_max * r.row_bytes, "one batch's rows gathered from the GPU tier")
    if r.exchange_bytes:
        b.charge("peer exchange", r.exchange_bytes, "one round's keys and rows, asked and served")
    if r.remote_exchange_bytes:
        b.charge("remote exchange", r.remote_exchange_bytes, "one round with the other machines, asked and served")
    b.check()
    rb = max(r.row_bytes, 1)
    rows = r.own_gpu_rows if total is None else min(r.own_gpu_rows, (total - b.used) // rb)
    b.gpu_rows, b.wanted_rows = int(rows), int(r.own_gpu_rows)
    if r.own_gpu_rows:
        b.charge("gpu tier", rows * r.row_bytes, f"{rows:,} of {r.own_gpu_rows:,} rows of this rank's GPU bins")
    return b
