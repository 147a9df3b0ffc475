"""Write the on-disk layout of a placement: per-bin shard files, index, cache node lists, manifest.

A layout is the directory LAYOUT:

    LAYOUT/manifest.json        versioned; written last (see manifest.Manifest)
    LAYOUT/index.npy            int64 (num_nodes, 2): bin index, row slot in that bin's shard
    LAYOUT/order.npy            node ids, hottest first (what a static CPU cache keeps)
    LAYOUT/lists/<bin>.nodes.npy  GPU/CPU cache bins: node ids in slot order
    LAYOUT/shards/<bin>.rows    GPU/CPU cache rows, unpadded (loaded whole into memory at start)
    LAYOUT/shards/<bin>.shard   an SSD bin without a mount path (one-disk machines, tests)
    <mount>/moment-<LAYOUT name>-<key>.shards/<bin>.shard   an SSD bin with a mount path

SSD shards hold their rows hottest first (ties by node id), aligned as the row format says (see
manifest.py), so the hottest rows of each SSD are contiguous. <key> hashes LAYOUT's absolute path,
so two layouts with the same name in different places never share shard directories.

Crash safety, start-clean (no resume): everything is written into LAYOUT.partial/ and
<mount>/...shards.partial/ under temporary names, each file fsynced and renamed, directories fsynced;
the manifest is written last; then the SSD directories and finally LAYOUT.partial are renamed. Only a
directory named LAYOUT with a manifest is a layout. A rerun (or a Python exception during the run)
removes stale .partial directories and orphaned shard directories of the same layout first.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np

import moment
from moment.errors import MomentError
from moment.outputs import write_error
from moment.placement.assignment import Assignment
from moment.placement.manifest import (
    DEFAULT_CHUNK,
    INDEX,
    MANIFEST,
    ORDER,
    ChunkHasher,
    DatasetRef,
    FileSum,
    Manifest,
    PlanRef,
    Progress,
    Shard,
    row_format,
    sha256_file,
)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_features(path: str | Path) -> np.memmap:
    """The dataset's features .npy as a read-only memmap of shape (num_nodes, ...)."""
    p = Path(path)
    if not p.is_file():
        raise MomentError("features file not found", source=str(p))
    try:
        f = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise MomentError(f"cannot read as a .npy array: {e}", source=str(p)) from None
    if f.ndim < 1 or f.shape[0] == 0 or f.dtype.hasobject:
        raise MomentError(f"expected a non-empty numeric (num_nodes, ...) array, got {f.shape} {f.dtype}",
                          source=str(p))
    if f.ndim > 1 and not f.flags.c_contiguous:
        raise MomentError("features must be C-ordered (not Fortran-ordered)", source=str(p))
    return f


def _layout_paths(out: Path) -> tuple[Path, str]:
    key = hashlib.sha256(str(out).encode()).hexdigest()[:10]
    return out.with_name(out.name + ".partial"), f"moment-{out.name}-{key}.shards"


def _probe_mount(name: str, path: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise MomentError(f"SSD bin {name}: mount path does not exist", source=str(p))
    if not p.is_dir():
        raise MomentError(f"SSD bin {name}: mount path is not a directory", source=str(p))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moment-probe-", dir=p)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise MomentError(f"SSD bin {name}: mount path is not writable ({e.strerror})", source=str(p)) from None
    return p


def _existing_ancestor(p: Path) -> Path:
    while not p.exists():
        p = p.parent
    return p


def block_size(path: str | Path, default: int = 4096) -> int:
    """Logical block size of the block device holding `path` (O_DIRECT's offset/length granularity).

    Read from sysfs (a partition's queue/ is its parent disk's); `default` where there is none
    (tmpfs, overlay, network file systems, non-Linux): 4096 is safe on every disk.
    """
    try:
        st = os.stat(_existing_ancestor(Path(path).absolute()))
        dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
        for q in (dev / "queue", dev.parent / "queue"):
            f = q / "logical_block_size"
            if f.is_file():
                size = int(f.read_text())
                return size if size >= 512 and not size & (size - 1) else default
    except (OSError, ValueError):
        pass
    return default


def _check_space(needs: list[tuple[Path, int]]) -> None:
    by_dev: dict[int, tuple[Path, int]] = {}
    for path, nbytes in needs:
        dev = os.stat(path).st_dev
        first, total = by_dev.get(dev, (path, 0))
        by_dev[dev] = (first, total + nbytes)
    for path, total in by_dev.values():
        free = shutil.disk_usage(path).free
        if total > free:
            raise MomentError(
                f"not enough free space: the layout needs {total / 2**30:.2f} GiB here, "
                f"{free / 2**30:.2f} GiB free", source=str(path))


def _remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()


def _external_dirs(layout: Path) -> list[Path]:
    """Shard directories on SSD mounts that an existing layout's manifest points to."""
    try:
        m = Manifest.model_validate_json((layout / MANIFEST).read_text())
    except (OSError, ValueError):
        return []
    dirs = {Path(s.path).parent for s in m.shards if Path(s.path).is_absolute()}
    return sorted(d for d in dirs if d.name.startswith("moment-") and d.name.endswith(".shards"))


def _group(a: Assignment) -> tuple[np.ndarray, np.ndarray]:
    """Node ids grouped by bin, hottest first within a bin; start offsets per bin."""
    rank_bin = a.bin_of[a.order]
    perm = np.argsort(rank_bin, kind="stable")
    counts = np.bincount(rank_bin, minlength=len(a.bins))
    return a.order[perm], np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _gather(rows_u8: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """rows_u8[ids], reading the memmap in ascending id order (fewer, more sequential page reads)."""
    srt = np.argsort(ids, kind="stable")
    out = np.empty((ids.shape[0], rows_u8.shape[1]), dtype=np.uint8)
    out[srt] = rows_u8[ids[srt]]
    return out


class _Writer:
    def __init__(self, total: int, progress: Progress | None):
        self.total, self.done, self.progress = total, 0, progress

    def tick(self, n: int) -> None:
        self.done += n
        if self.progress:
            self.progress(self.done, self.total)

    def shard(self, tmp: Path, final: Path, rows_u8, nodes, stride: int, nbytes: int, chunk: int,
              batch_rows: int) -> list[str]:
        hasher = ChunkHasher(chunk)
        row_bytes = rows_u8.shape[1]
        with open(tmp, "wb") as f:
            for s in range(0, nodes.shape[0], batch_rows):
                data = _gather(rows_u8, nodes[s : s + batch_rows])
                if stride != row_bytes:
                    buf = np.zeros((data.shape[0], stride), dtype=np.uint8)
                    buf[:, :row_bytes] = data
                    data = buf
                f.write(data.data)
                hasher.update(data.data)
                self.tick(data.nbytes)
            tail = nbytes - nodes.shape[0] * stride
            if tail:
                z = bytes(tail)
                f.write(z)
                hasher.update(z)
                self.tick(tail)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return hasher.finish()


def _save_npy(path: Path, arr: np.ndarray, rel: str) -> FileSum:
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return FileSum(path=rel, bytes=path.stat().st_size, sha256=sha256_file(path))


def write_layout(
    out_dir: str | Path,
    features_path: str | Path,
    assignment: Assignment,
    *,
    plan: PlanRef | None = None,
    align: int | None = None,
    row_mode: Literal["auto", "pad", "pack"] = "auto",
    dataset_checksum: str | None = None,
    manifest_extra: dict[str, Any] | None = None,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
    batch_bytes: int = 32 << 20,
    overwrite: bool = False,
) -> Path:
    """Write `assignment`'s layout of the features at `features_path` to `out_dir`; returns its path.

    `align`: row alignment; by default the largest logical block size of the devices the shards go to
    (`block_size`), so rows are no larger than O_DIRECT needs (512 B rows on a 512e disk: no read
    amplification; 4096 would read 8x the bytes).
    `dataset_checksum`: the dataset's sha256 if known (else the features file is hashed).
    `progress(done_bytes, total_bytes)`; an exception from it aborts and removes the partial output.
    Everything that can be checked (sizes, paths, free space) is checked before anything is written.
    """
    out = Path(out_dir).absolute()
    feats = open_features(features_path)
    n = int(feats.shape[0])
    rows_u8 = feats.reshape(n, -1).view(np.uint8) if feats.ndim > 1 else feats.reshape(n, 1).view(np.uint8)
    if assignment.num_nodes != n:
        raise MomentError(f"the assignment places {assignment.num_nodes} nodes but the dataset has {n}",
                          source=str(features_path))
    if align is None:
        targets = [out.parent] + [Path(b.path) for b in assignment.bins if not b.is_cache and b.path is not None]
        align = max(block_size(t) for t in targets)
    fmt = row_format(int(rows_u8.shape[1]), align, row_mode)
    if chunk_bytes <= 0 or chunk_bytes % align:
        raise MomentError(f"checksum chunk ({chunk_bytes} B) must be a positive multiple of the alignment {align}")
    bins = assignment.bins
    nodes, starts = _group(assignment)
    if int(starts[-1]) != n:
        raise MomentError("the assignment is inconsistent (its order is not a permutation of the nodes)")
    partial, ext_name = _layout_paths(out)

    # -- plan every file and check paths and space before touching anything
    plans = []  # (bin index, final path inside partial or mount, manifest path, stride, nbytes)
    needs: list[tuple[Path, int]] = []
    home = _existing_ancestor(out.parent)
    mounts: list[Path] = []
    local = 1 << 20
    for i, b in enumerate(bins):
        rows = int(starts[i + 1] - starts[i])
        if b.is_cache:
            stride, nbytes = fmt.row_bytes, rows * fmt.row_bytes
            local += nbytes + rows * 8 + 128
            plans.append((i, partial / "shards" / f"{b.name}.rows", f"shards/{b.name}.rows", stride, nbytes))
            continue
        stride = fmt.stride
        nbytes = -(-rows * stride // fmt.align) * fmt.align
        if b.path is None:
            local += nbytes
            plans.append((i, partial / "shards" / f"{b.name}.shard", f"shards/{b.name}.shard", stride, nbytes))
        else:
            m = _probe_mount(b.name, b.path).absolute()
            if m not in mounts:
                mounts.append(m)
            needs.append((m, nbytes))
            final = m / ext_name / f"{b.name}.shard"
            plans.append((i, m / (ext_name + ".partial") / f"{b.name}.shard", str(final), stride, nbytes))
    needs.append((home, local + n * 16 + 128))
    if out.exists() and not overwrite:
        raise MomentError("layout already exists", source=str(out), hint="pass overwrite to replace it")
    _check_space(needs)

    stale = [partial] + [m / (ext_name + s) for m in mounts for s in (".partial", "")]
    if out.exists():
        stale += [out, *_external_dirs(out)]
    _remove(stale)  # start clean: old layout (overwrite), stale partial output, orphaned shard dirs
    try:
        return _write(out, partial, ext_name, mounts, feats, rows_u8, features_path, assignment, fmt, nodes,
                      starts, plans, plan, dataset_checksum, manifest_extra, progress, chunk_bytes, batch_bytes)
    except BaseException as e:
        _remove([partial] + [m / (ext_name + ".partial") for m in mounts])
        if not out.exists():
            _remove([m / ext_name for m in mounts])
        if isinstance(e, OSError):  # a full disk or a failing device: one message, nothing left behind
            raise write_error(e, out, doing="cannot write the layout") from None
        raise


def _write(out, partial, ext_name, mounts, feats, rows_u8, features_path, a, fmt, nodes, starts, plans, plan,
           dataset_checksum, manifest_extra, progress, chunk_bytes, batch_bytes) -> Path:
    n = int(feats.shape[0])
    total = sum(p[4] for p in plans) + (0 if dataset_checksum else Path(features_path).stat().st_size)
    w = _Writer(total, progress)
    if dataset_checksum is None:
        dataset_checksum = sha256_file(features_path, progress, 0, total)
        w.done = Path(features_path).stat().st_size
    (partial / "shards").mkdir(parents=True)
    (partial / "lists").mkdir()
    for m in mounts:
        (m / (ext_name + ".partial")).mkdir()

    shards: list[Shard] = []
    batch_rows = max(1, batch_bytes // max(fmt.stride, fmt.row_bytes))
    for i, final, mpath, stride, nbytes in plans:
        b = a.bins[i]
        ids = nodes[starts[i] : starts[i + 1]]
        sums = w.shard(final.with_name("." + final.name + ".tmp"), final, rows_u8, ids, stride, nbytes,
                       chunk_bytes, batch_rows)
        shards.append(Shard(bin=b.name, kind=b.kind, path=mpath, rows=int(ids.shape[0]), stride=stride,
                            bytes=nbytes, chunk_bytes=chunk_bytes, chunk_sha256=sums))

    index = np.full((n, 2), -1, dtype=np.int64)
    counts = np.diff(starts)
    index[nodes, 0] = np.repeat(np.arange(len(a.bins), dtype=np.int64), counts)
    index[nodes, 1] = np.arange(n, dtype=np.int64) - np.repeat(starts[:-1], counts)
    if (index[:, 0] < 0).any():
        raise MomentError("the assignment is inconsistent (some nodes have no bin)")
    index_sum = _save_npy(partial / INDEX, index, INDEX)
    del index
    lists = {}
    for b in (b for b in a.bins if b.is_cache):
        i = a.bins.index(b.name)
        rel = f"lists/{b.name}.nodes.npy"
        lists[b.name] = _save_npy(partial / rel, nodes[starts[i] : starts[i + 1]], rel)

    odt = np.int32 if n < 2**31 else np.int64
    order_sum = _save_npy(partial / ORDER, a.order.astype(odt), ORDER)
    manifest = Manifest(
        created_by=f"moment {moment.__version__}",
        plan=plan or PlanRef(policy=a.policy, pool=a.pool),
        dataset=DatasetRef(features_path=str(Path(features_path).absolute()), sha256=dataset_checksum,
                           num_nodes=n, row_shape=list(feats.shape[1:]), dtype=feats.dtype.str),
        row=fmt, bins=a.bins, shards=shards, index=index_sum, cache_lists=lists, order_file=order_sum,
        extra=manifest_extra or {},
    )
    tmp = partial / ("." + MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        f.write(manifest.model_dump_json(indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, partial / MANIFEST)
    for d in (partial, partial / "shards", partial / "lists"):
        fsync_dir(d)
    for m in mounts:  # commit: SSD directories first, the layout directory last
        fsync_dir(m / (ext_name + ".partial"))
        os.replace(m / (ext_name + ".partial"), m / ext_name)
        fsync_dir(m)
    os.replace(partial, out)
    fsync_dir(out.parent)
    return out
