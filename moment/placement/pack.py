"""DiskGNN-style packed features: each mini-batch's uncached rows written contiguously, ahead of training.

Why (DiskGNN §4, offline sampling + packing): with the batches sampled ahead (they are deterministic:
`moment.workload.trace.sample_trace` samples exactly what training will), each batch's rows that the
caches will not hold can be copied, in batch order, into one file per rank. Training then reads a
batch's misses as one or a few large sequential reads with no read amplification, at the price of
disk space: a row read by several batches is stored once per batch. The pack is only an accelerator:
a row not found in its batch's segment (a smaller cache at run time, an epoch not packed) is read
from the layout, so the features stay bit-exact whatever the pack holds.

On disk, inside the layout: ``pack/pack.json`` (parameters, per-file sizes and sha256, the id of the
layout it was made for) and per rank ``rank<r>.bin`` (segments, each aligned to the layout's block) and
``rank<r>.npz`` (per segment: its split, epoch, batch, byte offset, row count, and the node ids it holds,
in the order its batch asks for them (older packs: sorted), so that a batch whose misses are its segment's
is read as written, with nothing sorted or searched). Besides the training batches it holds the
validation batches a run reads after each epoch (older packs: training only): their uncached rows lie
scattered over the whole layout, one small read each at the disk's IOPS limit, and a segment makes them
one sequential read. `moment layout verify` checks all of it
(`pack_problems`); a run checks its rank's files' sizes and index structure and that the pack is this
layout's (`open_pack`), hashing them with --verify.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from moment import testpoints
from moment.caching.tiers import NodeBits
from moment.errors import NPZ_ERRORS, MomentError, validation_error
from moment.io.device import no_gpu_driver
from moment.io.files import npy_header
from moment.io.sequences import subsequence
from moment.locking import locked
from moment.outputs import (atomic_file, follow_umask, publish_dir, remove_stale, sha256_file, stale,
                             temp_prefix)
from moment.placement.manifest import LayoutManifest, check_dataset, layout_id, load_manifest
from moment.sizes import fmt_size
from moment.workload.graph import GraphDataset

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

PACK_DIR = "pack"
FORMAT = "moment-pack"
#: a segment's split as the index stores it (`Segments.split`): training batches, then the evaluation splits packed
SPLIT_CODES = {"train": 0, "val": 1}
EVAL_SPLITS = ("val",)  # what a run evaluates after each epoch (moment.runtime.train), so what a pack holds
PACKED = ("train", *EVAL_SPLITS)  # the order of a rank's segments: its training batches, then each split's
#: of the free space on the layout's disk, what a pack may be estimated to take (the rest: what else is written)
PACK_ROOM_SHARE = 0.95


class PackFile(BaseModel):
    rank: int
    data: str
    index: str
    bytes: int
    rows: int
    data_sha256: str
    index_sha256: str
    index_bytes: int | None = Field(None, description="size of the index file (absent in older packs)")


class PackManifest(BaseModel):
    """What the pack was made for: a run with other parameters samples other batches."""

    format: str = FORMAT
    layout_index_sha256: str
    layout_id: str | None = Field(None, description="`manifest.layout_id` of the layout it was made for "
                                                    "(absent in older packs: the index checksum decides)")
    layout: str | None = Field(None, description="where that layout was when the pack was written")
    world_size: int
    batch_size: int
    fanouts: list[int]
    seed: int
    epochs: int
    cached_rows: int
    row_bytes: int
    align: int
    feature_bytes: int
    files: list[PackFile]
    eval_splits: list[str] = Field(default_factory=list, description="evaluation splits packed besides training "
                                                                      "(absent in older packs: none)")
    segment_order: Literal["batch", "sorted"] = Field(
        "sorted", description="a segment's rows: in the order its batch asks for them, or by node id (older packs)")

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def command(self, layout: str | Path, dataset: str | Path | None = None, *, epochs: int | None = None,
                cached: int | None = None) -> str:
        """The `moment data pack` that writes this pack again for `epochs`, or for caches of the `cached` hottest
        rows (None: its own): what the runtime's notes give a user whose run the pack does not fit."""
        data = f" --dataset {shlex.quote(str(dataset))}" if dataset is not None else ""
        cached = self.cached_rows if cached is None else cached
        return (f"moment data pack --layout {shlex.quote(str(layout))}{data} --ranks {self.world_size} "
                f"--epochs {self.epochs if epochs is None else epochs} --batch-size {self.batch_size} "
                f"--fanouts {','.join(map(str, self.fanouts))} --seed {self.seed} "
                f"{f'--cached {cached}' if cached else '--whole'} --overwrite")

    def mismatch(self, *, world_size: int, batch_size: int, fanouts: Sequence[int], seed: int) -> str | None:
        """Why a run with these parameters would not read the batches packed (None when it would)."""
        want = {"ranks": self.world_size, "batch size": self.batch_size, "fan-outs": list(self.fanouts),
                "seed": self.seed}
        got = {"ranks": world_size, "batch size": batch_size, "fan-outs": list(fanouts), "seed": seed}
        bad = [f"{k} {got[k]} (pack: {want[k]})" for k in want if want[k] != got[k]]
        return ", ".join(bad) or None


def pack_path(layout: str | Path) -> Path:
    return Path(layout) / PACK_DIR


def load_pack(layout: str | Path) -> PackManifest | None:
    """The layout's pack manifest, or None when the layout has no pack."""
    p = pack_path(layout) / "pack.json"
    if not p.is_file():
        return None
    try:
        m = PackManifest.model_validate_json(p.read_text())
    except ValidationError as e:
        raise validation_error(e, "the pack manifest is unreadable", source=str(p),
                               hint="rewrite it with `moment data pack`") from None
    except (OSError, ValueError) as e:
        raise MomentError(f"the pack manifest is unreadable ({str(e).splitlines()[0]})", source=str(p),
                          hint="rewrite it with `moment data pack`") from None
    if m.format != FORMAT:
        raise MomentError(f"not a Moment pack (format {m.format!r})", source=str(p))
    return m


def pack_files(layout: str | Path) -> set[str]:
    """The layout-relative paths of the layout's pack (empty without one; an unreadable pack owns only
    its manifest, so removing the layout refuses the rest), and what a killed pack writer left beside it
    (`.pack.tmp-PID-...`: `layout rm` refused it as a person's files)."""
    left = set()
    for d in stale(pack_path(layout), set_aside=True):
        left |= {f"{d.name}/", *(f"{d.name}/{q.relative_to(d)}" for q in d.rglob("*") if not q.is_dir())}
    p = pack_path(layout) / "pack.json"
    if not p.is_file():
        return left
    out = {f"{PACK_DIR}/pack.json", *left}
    try:
        m = PackManifest.model_validate_json(p.read_text())
    except (OSError, ValidationError, ValueError):
        return out
    for f in m.files:
        if "/" not in f.data and "/" not in f.index:
            out |= {f"{PACK_DIR}/{f.data}", f"{PACK_DIR}/{f.index}"}
    return out


@dataclass
class Segments:
    """One rank's pack index: where each (split, epoch, batch) segment lies and which nodes it holds."""

    epoch: np.ndarray
    batch: np.ndarray
    offset: np.ndarray  # byte offset of the segment in the rank's data file
    id_start: np.ndarray  # segments + 1, into `ids`
    ids: np.ndarray  # per segment, its node ids: in its batch's order, or sorted (`sorted_ids`: older packs)
    split: np.ndarray | None = None  # per segment, SPLIT_CODES; None: every segment a training batch's
    sorted_ids: bool = False

    def __post_init__(self) -> None:
        if self.split is None:
            self.split = np.zeros(self.epoch.shape, np.uint8)

    @classmethod
    def load(cls, path: Path, sorted_ids: bool = False) -> Segments:
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(z["epoch"], z["batch"], z["offset"], z["id_start"], z["ids"],
                           z["split"] if "split" in z.files else None, sorted_ids)
        except NPZ_ERRORS as e:
            raise MomentError(f"pack index unreadable ({e})", source=str(path),
                              hint="rewrite it with `moment data pack`") from None

    def problem(self, *, num_nodes: int, row_bytes: int, align: int, data_bytes: int, rows: int,
                epochs: int) -> str | None:
        """What is wrong with this index's structure, or None: every segment must lie inside the data
        file, aligned, without overlap, and hold node ids below `num_nodes` (a bad index would read other rows
        or past the file, not fail), in an older pack sorted and distinct."""
        arrays = (self.epoch, self.batch, self.offset, self.id_start, self.ids, self.split)
        if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays):
            return "its arrays are not 1-d integer arrays"
        s = self.epoch.shape[0]
        if (self.batch.shape[0] != s or self.offset.shape[0] != s or self.split.shape[0] != s
                or self.id_start.shape[0] != s + 1):
            return (f"its arrays disagree on the segment count (epoch {s}, batch {self.batch.shape[0]}, offset "
                    f"{self.offset.shape[0]}, split {self.split.shape[0]}, id_start {self.id_start.shape[0]} = "
                    "segments + 1)")
        if s and not np.isin(self.split, list(SPLIT_CODES.values())).all():
            return f"a segment's split is not one of {sorted(SPLIT_CODES.values())}"
        start, ids = self.id_start.astype(np.int64), self.ids
        if start[0] != 0 or start[-1] != ids.shape[0] or ids.shape[0] != rows or (np.diff(start) < 0).any():
            return (f"id_start must rise from 0 to the {rows} rows the pack manifest records "
                    f"(got {int(start[0])}..{int(start[-1])} over {ids.shape[0]} ids)")
        if s and (int(self.epoch.min()) < 0 or int(self.epoch.max()) >= epochs or int(self.batch.min()) < 0):
            return f"a segment's epoch is outside [0, {epochs}) or its batch is negative"
        off = self.offset.astype(np.int64)
        end = off + np.diff(start) * row_bytes
        if s and (int(off.min()) < 0 or (off % align).any() or (end[:-1] > off[1:]).any() or int(end[-1]) > data_bytes):
            return (f"its segments do not lie in order, {align}-byte aligned, inside the {data_bytes}-byte "
                    "data file")
        if ids.shape[0] and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
            return f"a node id is outside [0, {num_nodes})"
        if not self.sorted_ids:
            return None
        inner = np.ones(max(ids.shape[0] - 1, 0), bool)
        inner[start[1:-1][(start[1:-1] > 0) & (start[1:-1] < ids.shape[0])] - 1] = False  # segment boundaries
        if (np.diff(ids.astype(np.int64))[inner] <= 0).any():
            return "a segment's node ids are not sorted and distinct"
        return None

    def find(self, epoch: int, batch: int, split: str = "train") -> int | None:
        hit = np.flatnonzero((self.epoch == epoch) & (self.batch == batch) & (self.split == SPLIT_CODES[split]))
        return int(hit[0]) if hit.size else None

    def held(self, seg: int, ids: np.ndarray, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        """For sorted, distinct node ids (a job's rows): the positions in `ids` of those segment `seg` holds (in
        the segment's order), and their byte offsets in the data file. The segment's ids are searched for
        among `ids`, not the other way round: a segment is one batch's rows, `ids` often the rows of several."""
        have = self.ids_of(seg)
        pos = np.searchsorted(ids, have)
        ok = pos < ids.shape[0]
        ok[ok] = ids[pos[ok]] == have[ok]
        return pos[ok], int(self.offset[seg]) + np.flatnonzero(ok).astype(np.int64) * row_bytes

    def rows_of(self, seg: int, ids: np.ndarray) -> np.ndarray | None:
        """The row in segment `seg` of each of `ids` (a batch's misses, in its order), or None when one is not
        there. A batch's misses are its segment's ids when the run's caches are those the pack was written for,
        and a part of them, in the same order, when they hold more: then the batch reads its segment whole, as
        written, and nothing is sorted, searched or merged (moment.runtime.disk_tier)."""
        have = self.ids_of(seg)
        if not self.sorted_ids:
            return subsequence(have, ids)
        if not have.shape[0]:
            return None if ids.shape[0] else np.zeros(0, np.int64)
        pos = np.searchsorted(have, ids)
        np.minimum(pos, have.shape[0] - 1, out=pos)
        return pos if np.array_equal(have[pos], ids) else None

    def ids_of(self, seg: int) -> np.ndarray:
        """The node ids segment `seg` holds, in its order."""
        return self.ids[self.id_start[seg]: self.id_start[seg + 1]]

    def whole(self, seg: int, ids: np.ndarray) -> bool:
        """Whether segment `seg` is the batch `ids` exactly, in its order: every row of it, nothing else (a pack
        that took no row as cached), so the batch can be read as the segment straight into its own buffer."""
        have = self.ids_of(seg)
        return have.shape[0] == ids.shape[0] and bool(np.array_equal(have, ids))

    def rows_in(self, seg: int) -> int:
        return int(self.id_start[seg + 1] - self.id_start[seg])

    @property
    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in (self.epoch, self.batch, self.offset, self.id_start, self.ids, self.split))

    @staticmethod
    def stored_bytes(path: Path) -> int:
        """`memory_bytes` of the index at `path` once loaded, read from its arrays' headers alone."""
        try:
            with np.load(path, allow_pickle=False) as z:
                total = 0
                names = ("epoch", "batch", "offset", "id_start", "ids")
                if "split" not in z.files:  # an older pack: the run makes the split array (a byte a segment)
                    with z.zip.open("epoch.npy") as f:
                        total += _header(f)[0][0]
                for name in names + (("split",) if "split" in z.files else ()):
                    with z.zip.open(name + ".npy") as f:
                        shape, dtype = _header(f)
                    total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                return total
        except NPZ_ERRORS as e:
            raise MomentError(f"pack index unreadable ({e})", source=str(path),
                              hint="rewrite it with `moment data pack`") from None


def _header(f) -> tuple[tuple[int, ...], np.dtype]:
    """An .npy member's shape and dtype, from its header alone."""
    shape, _, dtype = npy_header(f)
    return shape, dtype


def id_dtype(num_nodes: int) -> type[np.signedinteger]:
    """The smallest integer type that holds every node id: what the index stores ids as."""
    return np.int32 if num_nodes < 2**31 else np.int64


def index_bytes(segments: int, rows: int, num_nodes: int) -> int:
    """What a run charges for a rank's pack index with these many segments and ids (as `_write_rank` stores
    them), known before the pack is written: `Segments.memory_bytes`, and the set of rows the pack took as
    cached (`cached_set_bytes`)."""
    return (segments * (4 + 4 + 8 + 1) + (segments + 1) * 8 + rows * np.dtype(id_dtype(num_nodes)).itemsize
            + cached_set_bytes(num_nodes))


def cached_mask(hot: np.ndarray, cached_rows: int, num_nodes: int) -> np.ndarray:
    """The rows a pack takes as cached, so that no segment holds them: the first `cached_rows` of the
    layout's hotness order `hot` (those its run's caches hold)."""
    cached = np.zeros(num_nodes, bool)
    cached[np.asarray(hot[:cached_rows])] = True
    return cached


def cached_set_bytes(num_nodes: int) -> int:
    """Which rows the pack took as cached, so that no segment holds them (the disk tier holds them as a
    `NodeBits`, reads those from the layout and the rest of a batch's rows from its segment)."""
    return NodeBits.state_bytes(num_nodes)


def pack_index_bytes(layout: str | Path, man: PackManifest) -> int:
    """The pack index a rank of a run holds: the largest rank's, since every rank must size its caches
    alike (the shared cache is one segment)."""
    return max(Segments.stored_bytes(pack_path(layout) / f.index) for f in man.files) + \
        cached_set_bytes(man.feature_bytes // man.row_bytes)


def refuse_split(layout: str | Path, m: LayoutManifest) -> None:
    """A machine's part of a split layout gets no pack: its batches read rows that other machines own."""
    if m.split is not None:
        raise MomentError(f"this is machine {m.split.name}'s part of a layout split over {len(m.split.machines)} "
                          "machines: its batches read rows other machines own, which a pack on this machine cannot "
                          "hold", source=str(layout), hint="train it without a pack (--io-shape block, the default)")


def write_pack(layout: str | Path, dataset: GraphDataset, *, world_size: int, batch_size: int,
               fanouts: Sequence[int], seed: int, epochs: int, cached_rows: int | None = None,
               budget_rows: Callable[[int], int] | None = None, overwrite: bool = False,
               progress: Callable[[int, int], None] | None = None) -> PackManifest:
    """Sample every rank's batches for `epochs` epochs and write each batch's rows outside the hottest
    cached rows (the rows the caches will hold) contiguously; the pack replaces any older one.

    The cached rows: `cached_rows`, or, under a memory budget, `budget_rows(index_bytes)` (the rows the
    run's cache gets when its pack index takes `index_bytes`) at its fixed point with this pack's own
    index, which is known once the batches are sampled (see `solve_cached_rows`).
    """
    if (cached_rows is None) == (budget_rows is None):
        raise ValueError("write_pack: give cached_rows or budget_rows")
    layout = Path(layout)
    m = load_manifest(layout)
    refuse_split(layout, m)
    check_dataset(layout, m, dataset)
    dataset.check()  # the pack copies its feature rows: a changed copy of the dataset must not pass
    n = m.dataset.num_nodes
    if cached_rows is not None and not 0 <= cached_rows <= n:
        raise MomentError(f"cached rows must be in [0, {n}] (got {cached_rows})")
    with locked(layout, "layout"):
        return _write_pack(layout, m, dataset, world_size=world_size, batch_size=batch_size, fanouts=fanouts,
                           seed=seed, epochs=epochs, cached_rows=cached_rows, budget_rows=budget_rows,
                           overwrite=overwrite, progress=progress)


def index_curve(traces: Sequence[Sequence], hot: np.ndarray, n: int) -> Callable[[int], int]:
    """The pack index bytes (largest rank's) as a function of the cached rows: a segment holds its
    batch's distinct rows outside the `c` hottest, so a rank's ids are its (batch, row) pairs whose row
    ranks c or later in the hotness order (rows not in the order are never cached). `traces`: each rank's
    traces (its training batches, its evaluation batches)."""
    pos = np.full(n, n, id_dtype(n))
    pos[np.asarray(hot)] = np.arange(len(hot), dtype=pos.dtype)
    curves = []
    for mine in traces:
        ranks = [pos[np.unique(tr.batch(t))] for tr in mine for t in range(len(tr))]
        curves.append((len(ranks), np.sort(np.concatenate(ranks)) if ranks else np.zeros(0, pos.dtype)))
    return lambda c: max((index_bytes(s, int(r.size - np.searchsorted(r, c)), n) for s, r in curves), default=0)


def solve_cached_rows(budget_rows: Callable[[int], int], index_at: Callable[[int], int], n: int,
                      rounds: int = 64) -> int:
    """The cached rows c = budget_rows(index_at(c)): what the run's cache holds with the pack that leaves
    out c rows. Both turn down as their argument grows, so c -> budget_rows(index_at(c)) is monotone:
    iterated from 0 it climbs to the least fixed point, and every value on the way caches no more than
    the run will (a row the pack leaves out and the run does not cache comes from neither). On a cycle
    (oscillation) its smallest value; after `rounds`, the largest value seen that the run covers."""
    seen: dict[int, int] = {}
    c = 0
    for _ in range(rounds):
        if c in seen:  # a cycle: its smallest value leads to a larger one, so the run covers it
            cycle = [c]
            while seen[cycle[-1]] != c:
                cycle.append(seen[cycle[-1]])
            return min(cycle)
        seen[c] = min(max(int(budget_rows(index_at(c))), 0), n)
        if seen[c] == c:
            return c
        c = seen[c]
    return max(k for k, v in seen.items() if v >= k)


def _write_pack(layout: Path, m, dataset: GraphDataset, *, world_size: int, batch_size: int, fanouts: Sequence[int],
                seed: int, epochs: int, cached_rows: int | None, budget_rows: Callable[[int], int] | None,
                overwrite: bool, progress: Callable[[int, int], None] | None) -> PackManifest:
    from moment.workload.trace import sample_eval_trace, sample_trace

    n, rb, align = m.dataset.num_nodes, m.row.row_bytes, m.row.align
    out = pack_path(layout)
    remove_stale(out, set_aside=True)  # a killed writer's leftovers, its previous pack put back (we hold the lock)
    if (out / "pack.json").exists() and not overwrite:
        raise MomentError("the layout already has a pack", source=str(out), hint="pass --overwrite to replace it")
    if (out.exists() or out.is_symlink()) and not (out / "pack.json").exists() and (
            not out.is_dir() or out.is_symlink() or any(out.iterdir())):  # a person's: replacing it would lose it
        raise MomentError("exists and is not a pack (it has no pack.json): refusing to replace it", source=str(out),
                          hint="move it out of the layout first")
    if m.order_file is None:
        raise MomentError("the layout has no hotness order (written by an older version)", source=str(layout),
                          hint="rewrite it with `moment place`")
    hot = np.load(layout / m.order_file.path, mmap_mode="r")

    def most_cached() -> np.ndarray:
        """The rows the run caches at most: under a budget, what it grants with no pack index to hold."""
        return cached_mask(hot, cached_rows if budget_rows is None else min(max(int(budget_rows(0)), 0), n), n)

    check_room(layout, dataset, world_size=world_size, batch_size=batch_size, fanouts=fanouts, seed=seed,
               epochs=epochs, align=align, cached=most_cached)

    def sample(r: int) -> list:
        """Rank r's training batches, then its evaluation batches (progress: by batch, over all ranks)."""
        out = []
        for k, split in enumerate(PACKED):  # progress: each (rank, split) an equal share of the bar
            step = (lambda d, t, k=k: progress((r * len(PACKED) + k) * t + d, world_size * len(PACKED) * t)
                    ) if progress else None
            args = dict(seed=seed, epochs=epochs, rank=r, world_size=world_size, progress=step)
            out.append(sample_trace(dataset, fanouts, batch_size, **args) if split == "train" else
                       sample_eval_trace(dataset, fanouts, batch_size, split=split, **args))
        return out

    # under a budget the cached rows depend on every rank's index: sample all first (else one at a time)
    traces: list = [sample(r) for r in range(world_size)] if budget_rows is not None else [None] * world_size
    if budget_rows is not None:
        cached_rows = solve_cached_rows(budget_rows, index_curve(traces, hot, n), n)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=layout))
    follow_umask(tmp, directory=True)
    cached = cached_mask(hot, cached_rows, n)
    feats = dataset.features_memmap().reshape(n, -1).view(np.uint8).reshape(n, rb)
    files: list[PackFile] = []
    try:
        for r in range(world_size):
            tr, traces[r] = traces[r] if traces[r] is not None else sample(r), None
            files.append(_write_rank(tmp, r, tr, cached, feats, rb, align, epochs))
        man = PackManifest(layout_index_sha256=m.index.sha256, layout_id=layout_id(m), layout=str(layout.absolute()),
                           world_size=world_size, batch_size=batch_size,
                           fanouts=list(fanouts), seed=seed, epochs=epochs, cached_rows=cached_rows, row_bytes=rb,
                           align=align, feature_bytes=n * rb, files=files, eval_splits=list(EVAL_SPLITS),
                           segment_order="batch")
        with atomic_file(tmp / "pack.json", text=True) as f:
            f.write(json.dumps(man.model_dump(), indent=1) + "\n")
        testpoints.reach("pack-written")
        old = publish_dir(tmp, out, "pack")
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MomentError(f"cannot write the pack: {e.strerror or e}", source=str(out)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return man


def pack_bytes_bound(dataset: GraphDataset, *, world_size: int, batch_size: int, fanouts: Sequence[int], epochs: int,
                     align: int) -> int:
    """The most a pack can take, without sampling: every batch of every rank reaching as many distinct rows as
    its fan-outs allow (at most every node), each segment padded to `align`."""
    reach, per_batch = 1, 1
    for f in fanouts:
        reach *= int(f)
        per_batch += reach
    rows = min(dataset.num_nodes, batch_size * per_batch)
    splits = [len(dataset.split(s)) for s in ("train", *EVAL_SPLITS)]
    batches = sum(-(-k // (world_size * batch_size)) + 1 for k in splits)  # a rank's, each epoch, at most
    return world_size * epochs * batches * (rows * dataset.row_bytes + align)


class NoRoom(MomentError):
    """A pack the disk holding the layout cannot take (`check_room`): `needed` its bytes about, `free` the disk's."""

    def __init__(self, message: str, *, needed: int, free: int, **kw: Any):
        super().__init__(message, **kw)
        self.needed, self.free = needed, free


def check_room(layout: Path, dataset: GraphDataset, *, world_size: int, batch_size: int, fanouts: Sequence[int],
               seed: int, epochs: int, align: int, cached: Callable[[], np.ndarray]) -> None:
    """Refuse, before hours of sampling and writing, a pack the disk holding the layout cannot take: a pack grows
    with its epochs (an epoch: 0.65x the features on the README's 100k layout), so 100 epochs of a large dataset
    can be many disks. Sampled only when the bound without sampling does not fit: rank 0's first epoch, its
    segments outside the rows the run will cache at most (`cached()`, asked only then), as the estimate of every
    rank's and epoch's."""
    from moment.workload.trace import sample_eval_trace, sample_trace

    free = shutil.disk_usage(layout).free
    room = int(PACK_ROOM_SHARE * free)
    if pack_bytes_bound(dataset, world_size=world_size, batch_size=batch_size, fanouts=fanouts, epochs=epochs,
                        align=align) <= room:
        return
    args = dict(seed=seed, epochs=1, rank=0, world_size=world_size)
    traces = [sample_trace(dataset, fanouts, batch_size, **args),
              *(sample_eval_trace(dataset, fanouts, batch_size, split=s, **args) for s in EVAL_SPLITS)]
    rb, first, held = dataset.row_bytes, 0, cached()
    for tr in traces:
        for t in range(len(tr)):
            ids = np.unique(tr.batch(t))
            first += -(-int((~held[ids]).sum()) * rb // align) * align
    per_epoch = world_size * first
    if epochs * per_epoch <= room:
        return
    fits = room // per_epoch if per_epoch else 0
    raise NoRoom(
        f"a pack of {epochs} epoch(s) would take about {fmt_size(epochs * per_epoch)} ({fmt_size(per_epoch)} an "
        f"epoch, from rank 0's first), and the disk holding the layout has {fmt_size(free)} free", source=str(layout),
        needed=epochs * per_epoch, free=free,
        hint=(f"pack fewer epochs (--epochs {fits} fits); a run reads the epochs past its pack from the layout, "
              "many times slower" if fits else "free space on that disk, or place the layout on a larger one"))


def _write_rank(dir_: Path, rank: int, traces: list, cached: np.ndarray, feats: np.ndarray, rb: int, align: int,
                epochs: int) -> PackFile:
    """Rank `rank`'s files: a segment per batch of its `traces` (one per split of PACKED, in its order)."""
    data, index = dir_ / f"rank{rank}.bin", dir_ / f"rank{rank}.npz"
    h = hashlib.sha256()
    offsets, id_start, kept = [], [0], []
    split, epoch, batch = [], [], []
    for name, tr in zip(PACKED, traces, strict=True):
        code = SPLIT_CODES[name]
        per_epoch = len(tr) // epochs
        t = np.arange(len(tr))
        split.append(np.full(len(tr), code, np.uint8))
        epoch.append((t // max(per_epoch, 1)).astype(np.int32))
        batch.append((t % max(per_epoch, 1)).astype(np.int32))
    pos = 0
    with atomic_file(data) as f:
        for ids in (tr.batch(t) for tr in traces for t in range(len(tr))):
            ids = ids[np.sort(np.unique(ids, return_index=True)[1])]  # distinct, in the batch's order
            ids = ids[~cached[ids]]
            pad = -pos % align
            if pad:
                z = bytes(pad)
                f.write(z)
                h.update(z)
                pos += pad
            offsets.append(pos)
            buf = np.ascontiguousarray(feats[ids]).tobytes()
            f.write(buf)
            h.update(buf)
            pos += len(buf)
            kept.append(ids)
            id_start.append(id_start[-1] + ids.shape[0])
        pad = -pos % align
        if pad:
            f.write(bytes(pad))
            h.update(bytes(pad))
            pos += pad
    with atomic_file(index) as f:
        np.savez(f, epoch=np.concatenate(epoch), batch=np.concatenate(batch), split=np.concatenate(split),
                 offset=np.array(offsets, np.int64), id_start=np.array(id_start, np.int64),
                 ids=np.concatenate(kept).astype(id_dtype(cached.shape[0]))
                 if kept else np.zeros(0, np.int64))
    return PackFile(rank=rank, data=data.name, index=index.name, bytes=pos, rows=id_start[-1],
                    data_sha256=h.hexdigest(), index_sha256=sha256_file(index), index_bytes=index.stat().st_size)


def foreign(man: PackManifest, m: LayoutManifest) -> str | None:
    """Why the pack was not made for the layout whose manifest is `m` (None when it was)."""
    where = f" (at {man.layout})" if man.layout else ""
    if man.layout_id is not None and man.layout_id != layout_id(m):
        return (f"the pack was made for another layout{where}, id {man.layout_id[:12]}, not this one "
                f"(id {layout_id(m)[:12]}): a pack copied from another layout, or a layout written again")
    if man.layout_index_sha256 != m.index.sha256:
        return f"the pack was made for another layout{where}: its index checksum differs from this layout's"
    if (man.row_bytes, man.align, man.feature_bytes) != (m.row.row_bytes, m.row.align,
                                                         m.dataset.num_nodes * m.row.row_bytes):
        return (f"the pack's rows ({man.row_bytes} B, aligned to {man.align} B) are not this layout's "
                f"({m.row.row_bytes} B, {m.row.align} B)")
    if [f.rank for f in man.files] != list(range(man.world_size)):  # the runtime finds rank r's files at r
        return f"the pack manifest lists files for ranks {[f.rank for f in man.files]}, not 0..{man.world_size - 1}"
    return None


def pack_problems(layout: str | Path, m: LayoutManifest, tick: Callable[[int], None] | None = None
                  ) -> list[tuple[Path, str]]:
    """Everything wrong with the layout's pack (none without one), as (file, what) pairs: what
    `moment layout verify` reports. The pack must be made for this layout, and every rank's files present
    with their sizes and checksums and their index well formed. `tick(bytes)` after each file hashed."""
    d = pack_path(layout)
    try:
        man = load_pack(layout)
    except MomentError as e:
        return [(d / "pack.json", _what(e))]
    if man is None:
        return []
    if why := foreign(man, m):
        return [(d / "pack.json", why)]
    out: list[tuple[Path, str]] = []
    for f in man.files:
        bad, _ = _rank_problems(d, man, f, m, hashes=True, tick=tick)
        out += bad
    return out


def _rank_problems(d: Path, man: PackManifest, f: PackFile, m: LayoutManifest, *, hashes: bool,
                   tick: Callable[[int], None] | None = None) -> tuple[list[tuple[Path, str]], Segments | None]:
    """One rank's files: present, their sizes, checksums (the data file's with `hashes`; the index's always:
    a changed id that still names a node would read another node's row, and since segments keep their batch's
    order no structure check can tell) and index structure; and its index."""
    out: list[tuple[Path, str]] = []
    for name, size, want in ((f.data, f.bytes, f.data_sha256), (f.index, f.index_bytes, f.index_sha256)):
        p = d / name
        if "/" in name or not p.is_file():
            out.append((p, "missing"))
            continue
        got = p.stat().st_size
        if size is not None and got != size:
            out.append((p, f"size {got} B, the pack manifest says {size} B (cut or replaced)"))
        elif (hashes or name == f.index) and sha256_file(p) != want:
            out.append((p, "checksum mismatch (the file changed after it was packed)"))
        if tick:
            tick(got)
    if out:
        return out, None
    try:
        seg = Segments.load(d / f.index, sorted_ids=man.segment_order == "sorted")
    except MomentError as e:
        return [(d / f.index, _what(e))], None
    why = seg.problem(num_nodes=m.dataset.num_nodes, row_bytes=man.row_bytes, align=man.align, data_bytes=f.bytes,
                      rows=f.rows, epochs=man.epochs)
    return ([(d / f.index, f"pack index is malformed: {why}")] if why else []), seg


def _what(e: MomentError) -> str:
    """A MomentError's message without its source and hint (the caller names the file)."""
    return str(e).splitlines()[0].removeprefix(f"{e.source}: ")


_REWRITE = "rewrite the pack with `moment data pack --overwrite`, or remove the layout's pack/ directory"


def refuse_unusable(layout: str | Path, man: PackManifest | None, m: LayoutManifest, world_size: int) -> None:
    """Refuse, in one line naming the pack, a pack a run of `world_size` ranks cannot read: none at all, one
    made for another layout, or for another number of ranks."""
    d = pack_path(layout)
    if man is None:
        raise MomentError("--io-shape packed needs a pack in the layout", source=str(layout),
                          hint="write one with `moment data pack --layout ...` (same ranks, batch size, "
                               "fan-outs and seed as this run)")
    if why := foreign(man, m):
        raise MomentError(why, source=str(d), hint=_REWRITE)
    if man.world_size != world_size:
        raise MomentError(f"the pack was made for {man.world_size} ranks, this run has {world_size}", source=str(d))


def open_pack(layout: str | Path, m: LayoutManifest, man: PackManifest | None, *, world_size: int, rank: int,
              hashes: bool = False) -> tuple[PackManifest, Segments]:
    """The layout's pack (`man`, its manifest as `load_pack` read it) and rank `rank`'s index as a run reads
    them: a pack for another number of ranks, a foreign pack, a cut file or a malformed index is refused
    in one line naming the file, before any batch reads it (`hashes`: re-hash the rank's files too, as
    --verify does)."""
    refuse_unusable(layout, man, m, world_size)
    assert man is not None
    if not 0 <= rank < world_size:
        raise MomentError(f"rank {rank} is not one of the pack's {world_size} ranks", source=str(pack_path(layout)))
    bad, seg = _rank_problems(pack_path(layout), man, man.files[rank], m, hashes=hashes)
    if bad:
        raise MomentError(bad[0][1], source=str(bad[0][0]), hint=_REWRITE)
    assert seg is not None
    return man, seg


def whole_here() -> tuple[bool, str]:
    """Whether a pack asked for with no kind (no --whole, --fitted, --cached or --memory-budget) is whole on this
    machine, and why, for the person asking.

    Why by the GPU driver: without one the run is on CPU, where the model shares the cores with the data path and
    a whole pack's batches are read straight into their buffers, no row copied, for about twice the SSD reads
    (bench/epoch.py on 2 cores: 0.88-1.04x the in-memory epoch, the fitted pack's 1.11-1.42x); on CUDA every
    batch is a copy of a staging slot either way, so the pack that leaves the caches' rows out reads half the
    bytes for the same work. A run says at its end when the other kind suits what bound it."""
    if no_gpu_driver():
        return True, ("this machine has no GPU driver, so training runs on CPU: each batch is read straight into "
                      "its buffer, no row copied, for about twice the SSD reads (--fitted: the caches' rows left out)")
    return False, ("this machine has a GPU driver: on CUDA each batch is a copy of a staging slot, so the caches' "
                   "rows are left out, half the SSD reads (--whole: every row, for a run on CPU)")


def what_it_holds(cached_rows: int) -> str:
    """What a pack's segments hold, for people: the rows outside the caches it was written for, or (none taken as
    cached: `moment data pack --whole`) every row, which a run on CPU reads straight into the batch's buffer."""
    if cached_rows:
        return f"leaving out the {cached_rows:,} hottest rows for the caches"
    return "every row of each batch, read straight into the batch's buffer on CPU"


def pack_summary(man: PackManifest) -> dict[str, Any]:
    return {"bytes": man.bytes, "rows": sum(f.rows for f in man.files), "epochs": man.epochs,
            "ranks": man.world_size, "cached_rows": man.cached_rows, "feature_bytes": man.feature_bytes,
            "disk_overhead": man.bytes / man.feature_bytes if man.feature_bytes else 0.0,
            "eval_splits": list(man.eval_splits)}
