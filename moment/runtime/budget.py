"""The memory budget of a training run: every large buffer is sized from it and accounted against it.

Why: an out-of-core run must live inside the memory the machine (or its cgroup) gives it, with the
features several times larger than that. Memory the kernel can take back (page cache) is not a cache
the runtime can count on, and memory it cannot take back (anonymous pages, shared segments) is an OOM
kill when it overflows. So the run states up front what it will hold, refuses when that does not fit,
and gives the CPU cache and the read buffers only what is left.

The budget is for the whole machine's share of the run (all local ranks and torchrun's agent), because
that is what a cgroup bounds. Items are either per rank (each local rank holds its own copy) or
shared (one copy on the machine: the graph structure's page cache, the static CPU cache segment).
Every rank computes the same split from the same inputs, so the ranks agree without talking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from moment.caching.tiers import SAMPLED_AHEAD, cache_state_bytes, shared_by_local_ranks
from moment.errors import MomentError
from moment.io.device import HostBatches
from moment.runtime.memory_use import own_and_shared, status_kib
from moment.sizes import parse_size

MARGIN = 0.05  # of the budget, kept free for allocator slack, page tables, thread stacks and what we do not count
MIN_MARGIN = 64 << 20
REUSE_SHARE = 0.5  # of what the read buffers leave, the most the heap's reuse takes before the CPU cache
#: a refusal suggests the minimum plus this (or 2% of it): a process's measured size varies a little between runs
ROOM = 16 << 20


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{int(b)} B"


def _cgroup_limit() -> int | None:
    """This process's cgroup memory limit (v1 or v2), None when unlimited or unknown."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if ctrl == "memory" or "memory" in ctrl.split(","):
            f = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes"
        elif ctrl == "":
            f = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max"
            if not f.is_file():
                f = Path("/sys/fs/cgroup/unified") / path.lstrip("/") / "memory.max"
        else:
            continue
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < (1 << 60):
            return int(text)
    return None


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def process_sizes(pid: int | str = "self") -> tuple[int, int]:
    """(the resident memory process `pid` alone holds now, the resident pages it shares with other processes),
    from one read. Its own is a rank's fixed cost, paid by every rank (the interpreter's and torch's heap, the
    model); the shared pages (the interpreter's and torch's libraries and, in a rank forked from torchrun's
    agent, the agent's memory it has not written) the machine holds once however many ranks map them, so they
    are charged once. All of its RSS its own where the kernel does not say (no smaps_rollup), 400 MiB where
    nothing can be read."""
    got = own_and_shared(pid)
    if got is not None:
        return got
    rss = status_kib(pid, "VmRSS")
    return (rss * 1024 if rss is not None else 400 << 20), 0


def alone_bytes() -> tuple[int, int]:
    """(own, shared) of this process as they will be once sibling ranks map the same files: its anonymous
    memory its own, its mapped files (the libraries) shared. For a process that stands for a rank
    before any runs (moment.runtime.start_sizes); 400 MiB own where /proc cannot be read."""
    anon, files = status_kib("self", "RssAnon"), status_kib("self", "RssFile")
    return (anon * 1024, (files or 0) * 1024) if anon is not None else (400 << 20, 0)


def machine_limit() -> tuple[int | None, str]:
    """The most memory a run on this machine can have: the cgroup limit or MemTotal, whichever is lower."""
    cands = [(v, w) for v, w in ((_cgroup_limit(), "the cgroup limit"), (_meminfo("MemTotal"), "MemTotal")) if v]
    return min(cands) if cands else (None, "")


def resolve_budget(spec: str | int | None) -> tuple[int | None, str]:
    """The machine-wide budget in bytes and where it came from; (None, ...) when unbounded (no option).

    A budget is refused when it is empty, not positive, or more than the machine (or its cgroup) has:
    a run sized for memory that is not there would be killed mid-epoch instead of refused now."""
    if spec is None:
        return None, "none (no --memory-budget)"
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        cg = _cgroup_limit()
        avail = _meminfo("MemAvailable")
        cands = [(v, w) for v, w in ((cg, "cgroup limit"), (avail, "MemAvailable")) if v]
        if not cands:
            raise MomentError("--memory-budget auto: cannot read a cgroup limit or /proc/meminfo",
                              hint="give the budget in bytes, e.g. --memory-budget 3GiB")
        v, what = min(cands)
        return v, f"auto: the {what} (the split keeps a margin of it free)"
    limit, what = machine_limit()
    b = parse_budget("--memory-budget", spec, limit or 0, "this machine's memory (e.g. 50%)", "3GiB")
    if limit is not None and b > limit:
        raise MomentError(f"--memory-budget {spec}: {fmt_bytes(b)} is more than this machine has ({what}: "
                          f"{fmt_bytes(limit)})", hint=f"give at most {limit // 2**20}MiB, or auto")
    return b, "given"


def parse_budget(flag: str, spec: str | int, whole: int, share: str, example: str) -> int:
    """`spec` in bytes (a share: of `whole`), refused unless it is a positive size; `share` and `example` say
    in the message what a share is of and what bytes look like. The host and device budgets' one rule."""
    shown = spec if str(spec).strip() else repr(spec)
    try:
        b = parse_size(spec, whole) if str(spec).strip() else None
    except MomentError:
        b = None
    if b is None:
        raise MomentError(f"{flag} {shown}: give bytes (e.g. {example}), a share of {share} or auto")
    if b <= 0:
        raise MomentError(f"{flag} {shown}: must be positive")
    return b


@dataclass
class Item:
    name: str
    bytes: int
    shared: bool
    note: str = ""


@dataclass
class MemoryBudget:
    """The run's budget (None: unbounded, still accounted) and what is charged against it.

    `charge` records a fixed need; `grant` hands out what is left (at most `want`); `check` raises when
    the fixed needs alone exceed the budget, naming the minimum.
    """

    total: int | None
    local_ranks: int = 1
    source: str = ""
    items: list[Item] = field(default_factory=list)

    def _machine(self, it: Item) -> int:
        return it.bytes if it.shared else it.bytes * self.local_ranks

    @property
    def used(self) -> int:
        """Machine-wide bytes charged so far."""
        return sum(self._machine(it) for it in self.items)

    @property
    def margin(self) -> int:
        return 0 if self.total is None else max(int(self.total * MARGIN), MIN_MARGIN)

    @property
    def free(self) -> int | None:
        return None if self.total is None else self.total - self.margin - self.used

    def charge(self, name: str, nbytes: int, *, shared: bool = False, note: str = "") -> int:
        self.items.append(Item(name, int(max(nbytes, 0)), shared, note))
        return int(nbytes)

    def minimum(self) -> int:
        """The least total under which what is charged fits with its margin (which grows with the total)."""
        return max(self.used + MIN_MARGIN, -(-self.used * 100 // round((1 - MARGIN) * 100)))

    def suggested(self) -> int:
        """The budget a refusal names: the minimum with room for the processes' measured size to vary
        between runs, in whole MiB."""
        need = self.minimum()
        return -(-(need + max(ROOM, need // 50)) // 2**20) * 2**20

    def check(self, what: str = "this run") -> None:
        if self.total is not None and self.free < 0:
            need = self.minimum()
            raise MomentError(
                f"--memory-budget {fmt_bytes(self.total)} is below the minimum {fmt_bytes(need)} {what} needs "
                f"({self.summary(short=True)})",
                hint=f"give at least --memory-budget {self.suggested() // 2**20}MiB (the minimum, "
                     "with room for the processes' measured size to vary between runs), or fewer ranks / a smaller "
                     "batch")

    def grant(self, name: str, want: int, *, shared: bool = False, share: float = 1.0, note: str = "") -> int:
        """Charge min(want, share of what is free) and return it (per rank unless shared)."""
        if self.total is None:
            got = int(want)
        else:
            per = 1 if shared else self.local_ranks
            got = int(min(want, max(self.free, 0) * share // per))
        self.charge(name, got, shared=shared, note=note)
        return got

    def summary(self, short: bool = False) -> str:
        parts = []
        for it in self.items:
            scope = "shared" if it.shared else (f"{self.local_ranks}x" if self.local_ranks > 1 else "")
            s = f"{it.name} {fmt_bytes(self._machine(it))}" + (f" [{scope}]" if scope and not short else "")
            if it.note and not short:
                s += f" ({it.note})"
            parts.append(s)
        return ", ".join(parts)

    def as_dict(self) -> dict:
        """For the metrics JSON: the budget, the split's prediction of the run's peak (every item charged,
        per machine) and the items."""
        return {"budget_bytes": self.total, "source": self.source, "local_ranks": self.local_ranks,
                "margin": self.margin if self.total else 0, "predicted_peak_bytes": self.used,
                "items": [{"name": it.name, "bytes": it.bytes, "shared": it.shared, "machine_bytes":
                           self._machine(it), "note": it.note} for it in self.items]}

    def lines(self) -> list[str]:
        """How the budget is split, for people (printed at start by rank 0)."""
        head = ("memory budget: " + (f"{fmt_bytes(self.total)} ({self.source})" if self.total is not None
                                     else "unbounded (accounting only)")
                + f", {self.local_ranks} local rank(s)")
        out = [head]
        for it in self.items:
            scope = "shared" if it.shared else ("per rank" if self.local_ranks > 1 else "")
            out.append(f"  {it.name:<22} {fmt_bytes(self._machine(it)):>11}  {scope:<8} {it.note}")
        if self.total is not None:
            out.append(f"  {'margin':<22} {fmt_bytes(self.margin):>11}")
            out.append(f"  {'unassigned':<22} {fmt_bytes(max(self.free, 0)):>11}")
        return out


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ


@dataclass
class RunShape:
    """What a rank's memory needs depend on: plain numbers, each stated by the component that holds the
    memory (the run plan asks them: moment.runtime.run_plan), so the split is testable without torch."""

    num_nodes: int
    row_bytes: int
    graph_bytes: int  # indptr + indices, memory-mapped, one copy per machine in the page cache
    labels_bytes: int
    rows_max: int  # the most rows one mini-batch touches (measured on sampled batches, with headroom)
    training_bytes: int  # one training step: activations, gradients, optimizer (moment.runtime.footprint.step_bytes)
    held_batches: int  # batches the pipeline holds besides the store's lookahead (Pipeline.held_batches)
    lookahead: int  # batches submitted before the first is completed (moment.caching.tiers.lookahead)
    sampler_map_bytes: int  # the sampler's node table (NeighborSampler.map_bytes)
    batch_ids_bytes: int  # one sampled batch's ids at the extent (MiniBatch.id_bytes)
    index_bytes: int  # the compact layout index (moment.placement.opened.Layout.index_bytes)
    own_gpu_rows: int  # rows of this rank's GPU bins in the layout
    layout_cpu_rows: int  # rows of the layout's CPU bins (the cache without a budget)
    cpu_limit_rows: int | None  # --cpu-cache-limit
    policy: str  # the CPU cache's policy: its bookkeeping is moment.caching.tiers.cache_state_bytes
    shape: str
    staging_bytes: int  # the reader's staging buffers (moment.runtime.gather.staging_bytes)
    process_bytes: int  # a rank's own start-up memory (process_sizes)
    agent_bytes: int  # torchrun's agent's own memory (0: no agent)
    pack_index_bytes: int = 0
    exchange_bytes: int = 0  # one round of the peer exchange (RowExchange.round_bytes); 0: no peer tier
    remote_exchange_bytes: int = 0  # one round of the remote exchange (footprint.remote_round_bytes); 0: no remote tier
    remote_reader_bytes: int = 0  # the remote tier's serving reader (footprint.remote_reader_bytes)
    device: str = "cpu"  # cuda: the batches, the training step and the GPU tier are in device memory (its own budget)
    model_step: bool = True  # False: a data-only run (the pipeline without the model)
    ring_bytes: int = 0  # cuda: the pinned staging ring batches go to the device through (moment.io.device.ring_bytes)
    upload_bytes: int = 0  # cuda: the GPU tier's table upload, one pinned chunk and its read (moment.io.device.upload_chunk)
    training_note: str | None = None  # how `training_bytes` was sized when not stated (a model of one's own)
    process_measured_on: str | None = None  # `process_bytes` is a measurement recorded that day, reused
    shared_start_bytes: int = 0  # pages the ranks and the agent share at start, once for the machine (process_sizes)
    index_shared: bool = False  # the ranks share one index, kept by their agent (Layout.keep_index): held once


@dataclass
class Split:
    budget: MemoryBudget
    gpu_rows: int
    cpu_rows: int
    buffer_bytes: int
    shared_cache: bool
    heap_reuse_bytes: int = 0  # per rank (moment.runtime.heap.keep_freed_memory)


def heap_reuse_want(r: RunShape) -> int:
    """The freed heap worth keeping per rank: two batches' transient arrays (the one training and the one
    being gathered: its rows and, on CPU, its step), which the next batches make again. On the bench's 8M
    run (moment.runtime.heap) the freed heap a rank kept peaked at 200-300 MiB; this gives 212 MiB."""
    return 2 * (r.rows_max * r.row_bytes + (r.training_bytes if r.device == "cpu" and r.model_step else 0))


def _grant_reuse(b: MemoryBudget, r: RunShape, share: float) -> int:
    """Less than one batch's rows would be trimmed as soon as kept: then none, and freed memory goes back."""
    got = b.grant("heap reuse", heap_reuse_want(r), share=share,
                  note="freed arrays kept for the next batches, not mapped anew")
    if got < r.rows_max * r.row_bytes:
        b.items[-1] = Item("heap reuse", 0, False, "too little left to keep a batch's arrays: freed ones go back")
        return 0
    return got


def _charge_fixed(b: MemoryBudget, r: RunShape) -> tuple[MemoryBudget, Item, int]:
    """Charge every need that does not shrink with the budget, the least read buffers included last
    (`split_budget` grants them again with the rest); (budget, the cache policy state item, least buffers)."""
    rb = r.row_bytes
    when = f", recorded {r.process_measured_on}" if r.process_measured_on else ""
    b.charge("process", r.process_bytes, note=f"interpreter, torch, model (measured: its own pages{when})")
    if r.shared_start_bytes:
        b.charge("shared pages", r.shared_start_bytes, shared=True,
                 note="libraries, and the agent's memory forked ranks share: held once")
    if r.agent_bytes:
        b.charge("torchrun agent", r.agent_bytes, shared=True)
    b.charge("graph structure", r.graph_bytes, shared=True, note="indptr + indices, memory-mapped")
    b.charge("labels", r.labels_bytes)
    b.charge("layout index", r.index_bytes, shared=r.index_shared,
             note="bin + slot per node" + (", loaded once by the agent" if r.index_shared else ""))
    state = Item("cache policy state", cache_state_bytes(r.policy, r.num_nodes, 0), False,
                 "per-node state (slot map, next use) + cached ids")
    b.items.append(state)
    held = r.lookahead + r.held_batches
    b.charge("sampler", r.sampler_map_bytes + (held + SAMPLED_AHEAD) * r.batch_ids_bytes,
             note=f"node map + {held} sampled batches and {SAMPLED_AHEAD} of the next sequence's, sampled ahead")
    feat = r.rows_max * rb
    if r.device == "cuda":  # the batches and the step are on the device; its budget charges them
        b.charge("staging ring", r.ring_bytes, note="pinned slots the batches go to the device through")
        if r.upload_bytes:
            b.charge("gpu table upload", r.upload_bytes, note="pinned chunk the GPU tier's rows go to the device through")
    else:
        held_cpu = r.held_batches + HostBatches.SPARE
        b.charge("batch features", held_cpu * feat, note=f"{r.held_batches} batches of {r.rows_max} rows, and "
                 f"{HostBatches.SPARE} kept for the next (its buffer reused)")
        b.charge("training", r.training_bytes,
                 note=r.training_note or "one step's activations, gradients and optimizer state")
    b.charge("staging", r.staging_bytes, note="reader windows")
    if r.exchange_bytes:
        b.charge("peer exchange", r.exchange_bytes, note="one round's keys and rows, asked and served")
    if r.remote_exchange_bytes:
        b.charge("remote exchange", r.remote_exchange_bytes, note="one round with the other machines, asked and served")
    if r.remote_reader_bytes:
        b.charge("remote reader", r.remote_reader_bytes, note="staging of the rows served to other machines")
    if r.pack_index_bytes:
        b.charge("pack index", r.pack_index_bytes, note="this rank's packed segments (moment data pack)")
    min_buffers = 2 * feat
    b.charge("read buffers (min)", min_buffers)
    return b, state, min_buffers


def minimum_budget(local_ranks: int, r: RunShape) -> MemoryBudget:
    """The fixed needs of a run of this shape, charged as `split_budget` charges them: `.minimum()` is
    the least budget it accepts (a run planned before its data exists asks this: bench/epoch.py)."""
    return _charge_fixed(MemoryBudget(None, local_ranks), r)[0]


def split_budget(total: int | None, source: str, local_ranks: int, r: RunShape, *, shared: bool | None = None,
                 what: str = "this run", heap: bool = True) -> Split:
    """Charge every fixed need, refuse if they do not fit, then size caches and read buffers. `shared`: the
    CPU cache is one segment for the local ranks (None: when the policy allows it); `what` the refusal names;
    `heap`: the process keeps freed memory when granted (a run does: moment.runtime.heap; a store alone not).

    Order of claims on what is left: the GPU-cache stand-in (CPU runs: at most a tenth; on CUDA the GPU
    tier is in device memory, which moment.runtime.device_budget budgets), read buffers (block reads: a
    third, at least two batches' misses), when a CPU step reads packed segments freed heap kept for reuse
    (`heap_reuse_want`, at most half), then the CPU cache takes the rest, each of its rows with the policy's
    per-row bookkeeping; in other runs the heap's reuse gets what the cache leaves.
    """
    b, state, min_buffers = _charge_fixed(MemoryBudget(total, local_ranks, source), r)
    b.check(what)
    b.items.pop()  # the minimum is granted below with the rest
    rb = r.row_bytes
    want_gpu = r.own_gpu_rows * rb if r.device == "cpu" else 0
    # on CPU runs a rank's GPU tier lives in its own memory; the other local ranks get its rows through the
    # peer exchange, one batch's worth at a time, and hold no copy
    gpu = b.grant("gpu cache stand-in", want_gpu, share=0.1, note="this rank's GPU bins") if want_gpu else 0
    if r.shape in ("block", "packed"):
        # the reads in flight are those of the lookahead's batches (two superbatches, each read into one
        # destination at most as large as the features): a pool larger than either never fills
        most = max(min_buffers, min(2 * r.num_nodes, r.lookahead * r.rows_max) * rb)
        buffers = b.grant("read buffers", most if total is not None else min(most, 4 * min_buffers), share=1 / 3)
        if buffers < min_buffers:
            b.items.pop()
            buffers = b.charge("read buffers", min_buffers)
    else:
        buffers = b.charge("read buffers", min_buffers)
    # where the step shares the cores with the pipeline (on CPU) and a miss is cheap to read (the packed shape:
    # large sequential segments), the faults of arrays made anew cost more than the cache's rows that keeping
    # them takes; rows and block reads pay per request, and a data-only run or a GPU step leaves the cores to
    # the reads: there the cache comes first (measured: moment.runtime.heap)
    reuse_first = heap and r.shape == "packed" and r.device == "cpu" and r.model_step
    reuse = _grant_reuse(b, r, REUSE_SHARE) if reuse_first else 0
    shared = shared_by_local_ranks(r.policy, local_ranks) if shared is None else shared
    row_state = cache_state_bytes(r.policy, r.num_nodes, 1) - state.bytes  # per cached row, in every rank
    if total is None:
        cpu_rows = r.layout_cpu_rows if r.cpu_limit_rows is None else r.cpu_limit_rows
        note = "the layout's CPU bins" if r.cpu_limit_rows is None else "--cpu-cache-limit"
    else:
        want = r.num_nodes if r.cpu_limit_rows is None else r.cpu_limit_rows
        per_row = rb * (1 if shared else local_ranks) + row_state * local_ranks  # machine bytes per row
        cpu_rows = min(want, max(b.free, 0) // per_row)
        note = "one shared segment" if shared else "per rank"
    b.charge("cpu cache", cpu_rows * rb, shared=shared, note=note)
    state.bytes = cache_state_bytes(r.policy, r.num_nodes, cpu_rows)
    if heap and not reuse_first:
        reuse = _grant_reuse(b, r, 1.0)
    return Split(b, gpu // rb if rb else 0, int(cpu_rows), int(buffers), shared, int(reuse))
