"""Check and read a written layout.

`verify_layout` recomputes every checksum (index, cache node lists, each shard chunk, the pack's files),
checks the structure of the index, the hotness order and the pack and that the pack was made for this
layout, and names the first bad file and byte offset. `open_layout` gives a reader whose
`rows(node_ids)` returns the features bit-exactly as in the dataset (used by tests and tools; the
training runtime reads the shards itself with O_DIRECT using `locate`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

from moment.errors import MomentError
from moment.outputs import bad_chunk, sha256_file
# load_manifest, check_dataset and CLUSTER_MANIFEST live in manifest.py (the pack needs them too); named here
# as well, where readers of a layout look for them
from moment.placement.manifest import (CLUSTER_MANIFEST, MANIFEST, DamagedManifest, LayoutManifest,  # noqa: F401
                                       Progress, Shard, check_dataset, load_manifest, unsealed_note)
from moment.placement.pack import load_pack, pack_problems
from moment.workload.graph import GraphDataset


class VerifyReport(BaseModel):
    path: str
    ok: bool
    files_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = []
    first_bad_file: str | None = None
    first_bad_shard: str | None = None  # bin name when the bad file is a shard
    first_bad_offset: int | None = None
    notes: list[str] = []  # what is sound but worth saying (a manifest without its own checksum)


def shard_path(layout: Path, s: Shard) -> Path:
    p = Path(s.path)
    return p if p.is_absolute() else layout / p


def dataset_note(layout: str | Path, m: LayoutManifest) -> str | None:
    """What to say where the dataset at the path the layout records is no longer the one it was placed from, or is
    gone (the layout itself is whole: `train` and `data pack` refuse the pair, and `layout verify` said OK)."""
    where = Path(m.dataset.features_path).parent
    try:
        ds = GraphDataset.open(where)
    except MomentError:
        return (f"the dataset it was placed from is no longer at {where}: train and data pack need it (--dataset "
                "where it is now), or place the layout again")
    try:
        check_dataset(layout, m, ds)
    except MomentError as e:
        return f"the dataset at {where} is not the one it was placed from: {e.message}"
    return None


def verify_layout(path: str | Path, progress: Progress | None = None) -> VerifyReport:
    """Check every checksum of the layout at `path`, and the structure of its index, hotness order, node
    lists and pack; never raises for damage, only reports it."""
    root = Path(path)
    try:
        m = load_manifest(root)
    except DamagedManifest as e:  # damage like any other file's (exit 1), not a refusal to look (exit 2)
        return VerifyReport(path=str(root), ok=False, files_checked=1, first_bad_file=str(root / MANIFEST),
                            problems=[str(e).split("\n  hint:")[0]])  # its source is the manifest
    rep = VerifyReport(path=str(root), ok=True, notes=[n for n in (unsealed_note(root, m), dataset_note(root, m)) if n])
    smalls = [m.index, *m.cache_lists.values(), *([m.order_file] if m.order_file else [])]
    total = sum(f.bytes for f in smalls) + sum(s.bytes for s in m.shards) + _pack_bytes(root)

    def bad(file: Path, msg: str, offset: int | None = None, shard: str | None = None) -> None:
        rep.ok = False
        rep.problems.append(f"{file}: {msg}")
        if rep.first_bad_file is None:
            rep.first_bad_file, rep.first_bad_offset, rep.first_bad_shard = str(file), offset, shard

    def tick(n: int) -> None:
        rep.bytes_checked += n
        if progress:
            progress(rep.bytes_checked, total)

    for f in smalls:
        fp = root / f.path
        rep.files_checked += 1
        if not fp.is_file():
            bad(fp, "missing")
        elif fp.stat().st_size != f.bytes:
            bad(fp, f"size {fp.stat().st_size} B, manifest says {f.bytes} B")
        elif sha256_file(fp) != f.sha256:
            bad(fp, "checksum mismatch")
        tick(f.bytes)
    if rep.ok:  # index, order and lists match their checksums: is what they protect well formed?
        try:
            for fp, msg in _structure_problems(root, m):
                bad(fp, msg)
        except (OSError, ValueError) as e:
            bad(root / m.index.path, f"unreadable: {e}")

    for s in m.shards:
        fp = shard_path(root, s)
        rep.files_checked += 1
        if not fp.is_file():
            bad(fp, f"shard of bin {s.bin} is missing", shard=s.bin)
            tick(s.bytes)
            continue
        size = fp.stat().st_size
        if size != s.bytes:
            bad(fp, f"shard of bin {s.bin}: size {size} B, manifest says {s.bytes} B", shard=s.bin)
        start = rep.bytes_checked
        k = bad_chunk(fp, s.chunk_bytes, s.chunk_sha256, progress=tick)
        if k is not None:
            off = k * s.chunk_bytes
            bad(fp, f"shard of bin {s.bin}: checksum mismatch in chunk {k} ({s.chunk_span(k)})", offset=off,
                shard=s.bin)
        tick(max(0, start + s.bytes - rep.bytes_checked))  # the rest of a shard not read to its end

    def tick_file(n: int) -> None:
        rep.files_checked += 1
        tick(n)

    for fp, msg in pack_problems(root, m, tick=tick_file):  # the pack is the layout's too: corrupt or foreign
        bad(fp, msg)
    return rep


class IndexCheck:
    """The layout index's structure, checked as its rows stream by (`add`, then `problem`): each node's
    (bin, slot) must point into that bin's shard and no two nodes may share a row, so the index is a
    bijection onto the shards' rows. A bad entry would otherwise read past a shard (a rank hangs or
    fails) or another node's row (silent garbage). Vectorised: one pass, a bit per row."""

    def __init__(self, m: LayoutManifest):
        self.m = m
        self.names = bin_names(m)
        self.rows = np.array(bin_rows(m), dtype=np.int64)
        self.base = np.concatenate(([0], np.cumsum(self.rows)[:-1])).astype(np.int64)
        n, total = m.dataset.num_nodes, int(self.rows.sum())
        self.seen = np.zeros(total, dtype=bool)
        self._problem = None if total == n else (f"the shards{' and remote bins' if m.split else ''} hold {total} "
                                                 f"rows for {n} nodes")
        for s in m.shards:  # and each shard's rows within its bytes (a run checks the file has them)
            if s.rows < 0 or s.rows * s.stride > s.bytes:
                self._problem = f"bin {s.bin} has {s.rows} rows of {s.stride} B, more than its {s.bytes} B"

    def add(self, start: int, block: np.ndarray) -> None:
        """Index rows [start, start + len(block)) as an integer (k, 2) array."""
        if self._problem is not None or not block.shape[0]:
            return
        b, slot = block[:, 0].astype(np.int64), block[:, 1].astype(np.int64)
        nb = self.rows.shape[0]
        bad = (b < 0) | (b >= nb)
        if bad.any():
            i = int(np.argmax(bad))
            self._problem = f"node {start + i} is in bin {int(b[i])}, but the layout has bins 0..{nb - 1}"
            return
        bad = (slot < 0) | (slot >= self.rows[b])
        if bad.any():
            i = int(np.argmax(bad))
            k = int(b[i])
            self._problem = (f"node {start + i} is at row {int(slot[i])} of bin {self.names[k]}, which holds "
                             f"{int(self.rows[k])} rows")
            return
        self.seen[self.base[b] + slot] = True

    def problem(self) -> str | None:
        """What is wrong (None when the index is sound), once every row was added."""
        if self._problem is None and not self.seen.all():
            self._problem = (f"some nodes share a row ({int((~self.seen).sum())} of the shards' rows belong to "
                             "no node)")
        return self._problem


def bin_names(m: LayoutManifest) -> list[str]:
    """The names of the bins the index numbers: the shards, then (a split layout) the remote bins."""
    return [s.bin for s in m.shards] + [f"remote:{r.name}" for r in (m.split.remote if m.split else [])]


def bin_rows(m: LayoutManifest) -> list[int]:
    """Rows of each bin the index numbers (`bin_names` order)."""
    return [s.rows for s in m.shards] + [r.rows for r in (m.split.remote if m.split else [])]


def damaged(what: str, why: str, path: Path) -> MomentError:
    """The error a reader of a malformed layout file (`what`: "index", "hotness order") raises."""
    return MomentError(f"the layout {what} is malformed: {why}", source=str(path),
                       hint="the layout is damaged: run `moment layout verify` and rewrite it")


def index_problem(m: LayoutManifest, index: np.ndarray, step: int = 1 << 20) -> str | None:
    """`IndexCheck` over a whole (memory-mapped) index array."""
    n = m.dataset.num_nodes
    if index.shape != (n, 2) or index.dtype.kind not in "iu":
        return f"expected an integer ({n}, 2) array, got {index.dtype} {index.shape}"
    chk = IndexCheck(m)
    for a in range(0, n, step):
        chk.add(a, np.asarray(index[a:a + step]))
    return chk.problem()


def order_form_problem(shape: tuple[int, ...], dtype: np.dtype, num_nodes: int) -> str | None:
    """The hotness order's shape and type, known from its file's header alone (none of its values read)."""
    if shape != (num_nodes,) or dtype.kind not in "iu":
        return f"expected {num_nodes} integer node ids, got {dtype} {shape}"
    return None


def order_problem(order: np.ndarray, num_nodes: int) -> str | None:
    """The hotness order must be every node id once (the runtime ranks rows by it)."""
    if why := order_form_problem(order.shape, order.dtype, num_nodes):
        return why
    if num_nodes and (int(order.min()) < 0 or int(order.max()) >= num_nodes):
        return f"a node id is outside [0, {num_nodes})"
    seen = np.zeros(num_nodes, dtype=bool)
    seen[order] = True
    if not seen.all():
        return f"{int((~seen).sum())} node ids are missing (others are repeated)"
    return None


def _structure_problems(root: Path, m: LayoutManifest) -> list[tuple[Path, str]]:
    """The index, the hotness order and the cache bins' node lists, checked for structure (their
    checksums matched: a manifest edited to match an edited file, or a layout written by a bug)."""
    out = []
    index = np.load(root / m.index.path, mmap_mode="r", allow_pickle=False)
    if why := index_problem(m, index):
        return [(root / m.index.path, f"the layout index is malformed: {why}")]
    if m.order_file is not None:
        order = np.load(root / m.order_file.path, mmap_mode="r", allow_pickle=False)
        if why := order_problem(order, m.dataset.num_nodes):
            out.append((root / m.order_file.path, f"the layout hotness order is malformed: {why}"))
    for i, s in enumerate(m.shards):
        f = m.cache_lists.get(s.bin)
        if f is None:
            continue
        nodes = np.load(root / f.path, allow_pickle=False)
        ok = nodes.shape == (s.rows,) and nodes.dtype.kind in "iu" and (
            not s.rows or (int(nodes.min()) >= 0 and int(nodes.max()) < m.dataset.num_nodes))
        if not ok or not (np.asarray(index[nodes.astype(np.int64)]) == np.stack(
                [np.full(s.rows, i), np.arange(s.rows)], axis=1)).all():
            out.append((root / f.path, f"node list of bin {s.bin} disagrees with the index"))
    return out


def _pack_bytes(root: Path) -> int:
    try:
        pk = load_pack(root)
    except MomentError:  # verify reports it
        return 0
    return sum(f.bytes + (f.index_bytes or 0) for f in pk.files) if pk else 0


class LayoutReader:
    """Read rows of a layout through its index (memory-maps the shards)."""

    def __init__(self, path: Path, manifest: LayoutManifest):
        self.path, self.manifest = path, manifest
        self.index = np.load(path / manifest.index.path, mmap_mode="r")
        self.dtype = np.dtype(manifest.dataset.dtype)
        self.row_shape = tuple(manifest.dataset.row_shape)
        self._maps: dict[int, np.ndarray] = {}

    @property
    def num_nodes(self) -> int:
        return self.manifest.dataset.num_nodes

    def shard_file(self, b: int) -> Path:
        return shard_path(self.path, self.manifest.shards[b])

    def locate(self, node_ids) -> tuple[np.ndarray, np.ndarray]:
        """(bin index, byte offset in that bin's shard file) of each node."""
        ids = self._ids(node_ids)
        ent = np.asarray(self.index[ids])
        self._refuse_remote(ids, ent[:, 0])
        strides = np.array([s.stride for s in self.manifest.shards], dtype=np.int64)
        return ent[:, 0], ent[:, 1] * strides[ent[:, 0]]

    def rows(self, node_ids) -> np.ndarray:
        """Features of `node_ids`, shape (len, *row_shape), bit-exact with the dataset (a split layout: only
        of the rows this machine holds)."""
        ids = self._ids(node_ids)
        ent = np.asarray(self.index[ids])
        self._refuse_remote(ids, ent[:, 0])
        rb = self.manifest.row.row_bytes
        out = np.empty((ids.shape[0], rb), dtype=np.uint8)
        for b in np.unique(ent[:, 0]).tolist():
            sel = ent[:, 0] == b
            out[sel] = self._map(b)[ent[sel, 1], :rb]
        return out.view(self.dtype).reshape((ids.shape[0], *self.row_shape))

    def _refuse_remote(self, ids: np.ndarray, bins: np.ndarray) -> None:
        far = bins >= len(self.manifest.shards)
        if far.any():
            i = int(np.argmax(far))
            owner = bin_names(self.manifest)[int(bins[i])].removeprefix("remote:")
            raise MomentError(f"node {int(ids[i])} is on machine {owner}: this is machine "
                              f"{self.manifest.split.name}'s part of a split layout", source=str(self.path))

    def _ids(self, node_ids) -> np.ndarray:
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise MomentError(f"node ids must be in [0, {self.num_nodes})", source=str(self.path))
        return ids

    def _map(self, b: int) -> np.ndarray:
        if b not in self._maps:
            s = self.manifest.shards[b]
            if s.rows == 0:
                self._maps[b] = np.zeros((0, s.stride), dtype=np.uint8)
            else:
                mm = np.memmap(self.shard_file(b), dtype=np.uint8, mode="r", shape=(s.rows * s.stride,))
                self._maps[b] = mm.reshape(s.rows, s.stride)
        return self._maps[b]


def open_layout(path: str | Path, *, expected_machine: str | None = None) -> LayoutReader:
    """Open a complete layout; with `expected_machine`, refuse one planned for another machine."""
    root = Path(path)
    m = load_manifest(root)
    if expected_machine is not None and m.plan.machine != expected_machine:
        raise MomentError(f"layout was planned for machine {m.plan.machine!r}, not {expected_machine!r}",
                          source=str(root), hint="re-run `moment place` for this machine")
    for s in m.shards:
        fp = shard_path(root, s)
        if not fp.is_file():
            raise MomentError(f"shard of bin {s.bin} is missing", source=str(fp))
    reader = LayoutReader(root, m)
    if why := index_problem(m, reader.index):
        raise damaged("index", why, root / m.index.path)
    return reader
