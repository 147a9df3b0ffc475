"""Write the on-disk layout of a placement: per-bin shard files, index, cache node lists, manifest.

A layout is the directory LAYOUT:

    LAYOUT/manifest.json        versioned; written last (see manifest.LayoutManifest)
    LAYOUT/index.npy            int64 (num_nodes, 2): bin index, row slot in that bin's shard
    LAYOUT/order.npy            node ids, hottest first (what a static CPU cache keeps)
    LAYOUT/lists/<bin>.nodes.npy  GPU/CPU cache bins: node ids in slot order
    LAYOUT/shards/<bin>.rows    GPU/CPU cache rows, unpadded (loaded whole into memory at start)
    LAYOUT/shards/<bin>.shard   an SSD bin without a mount path (one-disk machines, tests)
    <mount>/moment-<LAYOUT name>-<key>.shards/<bin>.shard   an SSD bin with a mount path

SSD shards hold their rows hottest first (ties by node id), aligned as the row format says (see
manifest.py), so the hottest rows of each SSD are contiguous. <key> hashes LAYOUT's absolute path,
so two layouts with the same name in different places never share shard directories; a rewrite
(--overwrite) uses the next free name (`...-<key>-1.shards`, ...), so the old layout's shard
directories stay untouched until the new layout is complete.

Crash safety (kill -9 at any instant leaves either the old layout or the new one, complete, at
LAYOUT): writers hold the lock on LAYOUT (moment.locking). Everything is written into LAYOUT.partial/
and <mount>/...shards.partial/ under temporary names, each file fsynced and renamed, directories
fsynced; the manifest is written last; the SSD directories are renamed to their final (new) names;
then LAYOUT.partial and LAYOUT are swapped in one atomic step (renameat2 RENAME_EXCHANGE; where the
file system lacks it, LAYOUT is renamed to LAYOUT.old first and a crash between the two renames is
repaired by the next writer, which puts LAYOUT.old back); only then are the old layout's SSD
directories and the old layout removed. Only a directory named LAYOUT with a manifest is a layout. A
rerun (or a Python exception during the run) removes stale .partial/.old directories and the shard
directories of this layout that they name or that were still being written (`.shards.partial`) and its
manifest does not point to; a complete shard directory nothing left behind names stays (a layout moved
away from LAYOUT still reads it: a new write takes the next free name). A .partial/.old is Moment's only when it
carries the mark naming LAYOUT (outputs.LEFTOVER_MARK: LAYOUT.partial is made with it, the old layout gets
it before it is swapped out), and anything else of that name is refused, never removed.

`remove_layout` (`moment layout rm`) removes a layout and every shard directory it owns.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

import moment
from moment import testpoints
from moment.errors import MomentError
from moment.inputs import exists
from moment.locking import locked
from moment.outputs import (
    ChunkHasher,
    atomic_file,
    check_replaceable,
    create_reason,
    LEFTOVER_MARK,
    fsync_dir,
    is_leftover,
    make_partial,
    manifest_head,
    mark_leftover,
    publish_dir,
    put_back,
    remove_stale,
    sha256_file,
    unnamed_entries,
    write_error,
)
from moment.placement.assignment import Assignment
from moment.placement.manifest import (
    DEFAULT_CHUNK,
    FORMAT,
    INDEX,
    MANIFEST,
    ORDER,
    DatasetRef,
    FileSum,
    LayoutManifest,
    PlanRef,
    Progress,
    Shard,
    SplitRef,
    row_format,
    sealed,
)
from moment.placement.pack import pack_files
from moment.placement.reader import CLUSTER_MANIFEST, load_manifest
from moment.sizes import fmt_size
from moment.workload.graph import MANIFEST as DATASET_MANIFEST
from moment.workload.graph import GraphDataset


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


def _layout_paths(out: Path) -> tuple[Path, Path, str]:
    """LAYOUT.partial, LAYOUT.old and the stem of LAYOUT's shard directory names on SSD mounts."""
    key = hashlib.sha256(str(out).encode()).hexdigest()[:10]
    return out.with_name(out.name + ".partial"), out.with_name(out.name + ".old"), f"moment-{out.name}-{key}"


def _owned(stem: str, name: str) -> bool:
    """Whether a directory name is one of the shard directories a layout with this stem writes."""
    return re.fullmatch(re.escape(stem) + r"(-[0-9]+)?\.shards(\.partial)?", name) is not None


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
        raise MomentError(f"SSD bin {name}: mount path is not writable: {create_reason(e, p)}",
                          source=str(p)) from None
    return p


_SHARD_DIR = re.compile(r"moment-.+\.shards(\.partial)?")


def check_ssd_path(name: str, path: str | Path, *layouts: Path) -> None:
    """Refuse an SSD mount path whose shard directory would be deleted with something Moment removes: one
    inside a layout being written or replaced (`layouts`, with their LAYOUT.partial/LAYOUT.old), inside any
    Moment layout, or inside a Moment shard directory (`moment-*.shards`, its own layout's or another's).
    Those go when the layout is replaced or removed, and the new shard with them. And one that is not a directory
    a file can be made in (`_probe_mount`): `place` asks before it samples."""
    _probe_mount(name, str(path))
    p = Path(path).absolute().resolve()
    owners = [q for x in layouts for q in (x, *_layout_paths(x)[:2])]
    for d in (p, *p.parents):
        if any(d == Path(x).absolute().resolve() for x in owners) or _is_layout(d) \
                or (d / CLUSTER_MANIFEST).is_file():
            why = "a Moment layout's directory"
        elif _SHARD_DIR.fullmatch(d.name):
            why = "a Moment shard directory"
        else:
            continue
        raise MomentError(f"SSD bin {name}: mount path is in {why} ({d}), which Moment deletes when that "
                          "layout is replaced or removed", source=str(path),
                          hint="give a directory outside every layout and shard directory (the SSD's mount point)")


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
            need, have = fmt_size(total), fmt_size(free)  # in GiB, a small layout's read "needs 0.00, 0.00 free"
            if need == have:  # the shortfall is below the rounding
                need, have = f"{total:,} B", f"{free:,} B"
            raise MomentError(f"not enough free space: the layout needs {need} here, {have} free", source=str(path))


def _remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()


def _referenced_dirs(layout: Path) -> set[Path]:
    """Shard directories outside `layout` that the manifest in it points to (none without one)."""
    try:
        m = LayoutManifest.model_validate_json((layout / MANIFEST).read_text())
    except (OSError, ValueError):
        return set()
    return {Path(s.path).parent for s in m.shards if Path(s.path).is_absolute()}


def _recover(out: Path, mounts: list[Path], home: Path | None = None) -> None:
    """Clean up after a killed or failed write of `out` (call holding its lock): put back an old layout
    a crash left at LAYOUT.old, then remove LAYOUT.partial, LAYOUT.old and the shard directories of this
    layout that those leftovers' manifests name, or that are still being written (`*.shards.partial` in
    `mounts`), and LAYOUT's manifest does not point to. A complete shard directory no leftover names is
    kept: a layout moved away from LAYOUT still names it. `home`: where the layout is
    published, if not at `out` (its shard directories are named for it, and those the layout there
    points to stay)."""
    partial, backup, stem = _layout_paths(out)
    remove_stale(out)  # a LAYOUT.partial killed while it was made (make_partial)
    ours = [d for d in (partial, backup) if is_leftover(d, out)]  # anything else of that name: refused
    if backup in ours and (backup / MANIFEST).is_file():
        put_back(out, backup)
    keep = _referenced_dirs(out)
    if home is not None:
        stem = _layout_paths(home)[2]
        keep |= _referenced_dirs(home)
    stale: set[Path] = set()
    for d in ours:
        for x in _referenced_dirs(d):
            stale |= {x, x.with_name(x.name + ".partial")}
    for m in {*mounts, *(x.parent for x in stale)}:
        if m.is_dir():
            stale |= {x for x in m.iterdir() if x.is_dir() and x.name.endswith(".partial")}
    _remove(sorted(x for x in stale if _owned(stem, x.name) and x not in keep and x.is_dir()))
    _remove(ours)


def drop_shard_dirs(root: Path, names: list[str] | None, home: Path) -> None:
    """Remove the shard directories on SSD mounts that the machine layouts under `root` (a split's
    directory being written, replaced or removed: `names`, default every layout there) point to, when they
    were written for the layout at HOME/NAME and the layout there now does not point to them."""
    root = Path(root)
    if names is None:  # a machine's write killed before it was published left its layout at NAME.partial
        names = sorted({d.name.removesuffix(".partial") for d in root.iterdir() if (d / MANIFEST).is_file()}
                       ) if root.is_dir() else []
    for name in names:
        stem, keep = _layout_paths(home / name)[2], _referenced_dirs(home / name)
        dirs = {x for lp in (root / name, root / f"{name}.partial") for d in _referenced_dirs(lp)
                for x in (d, d.with_name(d.name + ".partial"))}
        _remove(sorted(x for x in dirs if _owned(stem, x.name) and x not in keep and x.is_dir()))


def _is_layout(d: Path) -> bool:
    head = manifest_head(d, MANIFEST)
    return head is not None and head.get("format") == FORMAT


def _new_shard_dir_name(out: Path, stem: str, mounts: list[Path]) -> str:
    """The first shard directory name of this layout that neither the current layout uses nor exists (one
    that exists may be named by a layout moved away from here: it is never written over)."""
    used = {d.name for d in _referenced_dirs(out)}
    for g in itertools.count():
        name = stem + (f"-{g}" if g else "") + ".shards"
        if name not in used and not any((m / name).exists() or (m / (name + ".partial")).exists() for m in mounts):
            return name
    raise AssertionError  # pragma: no cover - the names that exist are finite


def check_layout_out(out: Path, overwrite: bool) -> None:
    """An existing layout directory is replaced only with `overwrite`, and only when it is a Moment layout
    holding nothing but what its manifest names (or an empty directory)."""
    if not exists(out):
        return
    if not overwrite:
        refuse_existing(out)
    _check_replaceable(out)


def refuse_existing(out: Path) -> None:
    """Without --overwrite: a layout (or an empty directory) is to be overwritten; anything else (a dataset given
    as --out) is no place for one, and --overwrite would not be the way."""
    if out.is_dir() and not out.is_symlink() and not (_is_layout(out) or (out / CLUSTER_MANIFEST).is_file()):
        try:
            empty = not any(os.scandir(out))
        except OSError:
            empty = False
        if not empty:
            raise MomentError("exists and is not a Moment layout (a dataset, or files of yours)", source=str(out),
                              hint="choose another --out")
    raise MomentError("layout already exists", source=str(out), hint="pass --overwrite to replace it")


def _check_replaceable(out: Path) -> None:
    """--overwrite replaces a Moment layout holding only what its manifest names, never a directory of
    something else nor files a person put in a layout."""
    named = None
    if (out / CLUSTER_MANIFEST).is_file() and not (out / MANIFEST).is_file():  # the other kind of layout
        raise MomentError("is a split layout, not one machine's layout: refusing to replace it with one",
                          source=str(out), hint=f"choose another --out, or remove it first with `moment layout rm {out}`")
    if _is_layout(out):
        try:
            named = _inside(out, LayoutManifest.model_validate(manifest_head(out, MANIFEST)))
        except ValueError:
            raise MomentError("its manifest is damaged, so what the layout owns is unknown: refusing to replace "
                              "it", source=str(out / MANIFEST), hint="choose another --out") from None
    check_replaceable(out, "layout", named)


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

    def shard(self, final: Path, rows_u8, nodes, stride: int, nbytes: int, chunk: int,
              batch_rows: int) -> list[str]:
        hasher = ChunkHasher(chunk)
        try:
            self._shard(final, rows_u8, nodes, stride, nbytes, batch_rows, hasher)
        except OSError as e:  # a write error names no file: this one failed (`_write_failure` names it)
            if e.filename is None:
                e.filename = str(final)
            raise
        return hasher.finish()

    def _shard(self, final: Path, rows_u8, nodes, stride: int, nbytes: int, batch_rows: int,
               hasher: ChunkHasher) -> None:
        row_bytes = rows_u8.shape[1]
        with atomic_file(final) as f:
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


def _save_npy(path: Path, arr: np.ndarray, rel: str) -> FileSum:
    with atomic_file(path) as f:
        np.save(f, arr, allow_pickle=False)
    return FileSum(path=rel, bytes=path.stat().st_size, sha256=sha256_file(path))


@dataclass(frozen=True)
class SplitPart:
    """One machine's part of a split layout, as `write_layout` writes it: the assignment places the rows the
    machine holds (its local node i is node `held[i]`), every other row goes to the remote bin of the
    machine that owns it (`remote[j]`: node ids of `ref.remote[j]`, in slot order)."""

    held: np.ndarray
    order: np.ndarray  # every node id, hottest first: the layout's hotness order
    ref: SplitRef
    remote: list[np.ndarray]


def write_layout(
    out_dir: str | Path,
    features_path: str | Path,
    assignment: Assignment,
    *,
    plan: PlanRef | None = None,
    align: int | None = None,
    row_mode: Literal["auto", "pad", "pack"] = "auto",
    dataset_checksum: str | None = None,
    dataset_id: str | None = None,
    manifest_extra: dict[str, Any] | None = None,
    progress: Progress | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
    batch_bytes: int = 32 << 20,
    overwrite: bool = False,
    split: SplitPart | None = None,
    home: str | Path | None = None,
) -> Path:
    """Write `assignment`'s layout of the features at `features_path` to `out_dir`; returns its path.

    `align`: row alignment; by default the largest logical block size of the devices the shards go to
    (`block_size`), so rows are no larger than O_DIRECT needs (512 B rows on a 512e disk: no read
    amplification; 4096 would read 8x the bytes).
    `dataset_checksum`: the dataset's sha256 if known (else the features file is hashed).
    `dataset_id`: the dataset's identity (`GraphDataset.dataset_id`), recorded so training refuses other
    data; by default that of the dataset whose features file `features_path` is, if it is one.
    `progress(done_bytes, total_bytes)`; an exception from it aborts and removes the partial output.
    Everything that can be checked (sizes, paths, free space) is checked before anything is written.
    With `overwrite`, the old layout stays complete and valid until the new one is (see the module doc).
    `split`: the layout is one machine's part of a split (`moment.placement.split`): `assignment` places
    only the rows it holds. `home`: where the layout will be published when it is written elsewhere first (a
    split's machine, inside the split's partial directory): its SSD shard directories are named for it.
    """
    out = Path(out_dir).absolute()
    feats = open_features(features_path)
    n = int(feats.shape[0])
    rows_u8 = feats.reshape(n, -1).view(np.uint8) if feats.ndim > 1 else feats.reshape(n, 1).view(np.uint8)
    placed = n if split is None else int(split.held.shape[0])
    if assignment.num_nodes != placed:
        raise MomentError(f"the assignment places {assignment.num_nodes} nodes but the "
                          f"{'dataset' if split is None else 'machine'} has {placed}", source=str(features_path))
    if align is None:
        targets = [out.parent] + [Path(b.path) for b in assignment.bins if not b.is_cache and b.path is not None]
        align = max(block_size(t) for t in targets)
    fmt = row_format(int(rows_u8.shape[1]), align, row_mode)
    if chunk_bytes <= 0 or chunk_bytes % align:
        raise MomentError(f"checksum chunk ({chunk_bytes} B) must be a positive multiple of the alignment {align}")
    bins = assignment.bins
    nodes, starts = _group(assignment)
    if int(starts[-1]) != placed:
        raise MomentError("the assignment is inconsistent (its order is not a permutation of the nodes)")
    if split is not None:  # local ids -> node ids, then the remote bins' rows after the shards'
        nodes = np.concatenate([split.held[nodes], *split.remote]).astype(np.int64)
        starts = np.concatenate([starts, starts[-1] + np.cumsum([r.shape[0] for r in split.remote],
                                                                dtype=np.int64)]).astype(np.int64)
        if nodes.shape[0] != n or not (np.bincount(nodes, minlength=n) == 1).all():
            raise MomentError("the split is inconsistent: the held and remote rows are not every node once")
    if dataset_id is None:
        dataset_id = _dataset_id_of(features_path)
    published = None if home is None else Path(home).absolute()
    partial, _, stem = _layout_paths(out)
    if published is not None:
        stem = _layout_paths(published)[2]

    # -- plan every file and check paths and space before touching anything
    specs = []  # (bin index, mount or None, stride, nbytes)
    needs: list[tuple[Path, int]] = []
    home = _existing_ancestor(out.parent)
    mounts: list[Path] = []
    local = 1 << 20
    for i, b in enumerate(bins):
        rows = int(starts[i + 1] - starts[i])
        if b.is_cache:
            local += rows * fmt.row_bytes + rows * 8 + 128
            specs.append((i, None, fmt.row_bytes, rows * fmt.row_bytes))
            continue
        nbytes = -(-rows * fmt.stride // fmt.align) * fmt.align
        if b.path is None:
            local += nbytes
            specs.append((i, None, fmt.stride, nbytes))
        else:
            m = Path(b.path).absolute()
            check_ssd_path(b.name, m, out, *([published] if published is not None else []))
            if m not in mounts:
                mounts.append(m)
            needs.append((m, nbytes))
            specs.append((i, m, fmt.stride, nbytes))
    needs.append((home, local + n * 16 + 128))
    check_layout_out(out, overwrite)

    with locked(out, "layout"):
        check_layout_out(out, overwrite)
        _check_space(needs)
        _recover(out, mounts, published)  # start clean: stale partial output and orphaned shard dirs of this layout
        ext_name = _new_shard_dir_name(out, stem, mounts)
        plans = []  # (bin index, file path while written, manifest path, stride, nbytes)
        for i, m, stride, nbytes in specs:
            b = bins[i]
            if m is not None:
                plans.append((i, m / (ext_name + ".partial") / f"{b.name}.shard",
                              str(m / ext_name / f"{b.name}.shard"), stride, nbytes))
            else:
                rel = f"shards/{b.name}.rows" if b.is_cache else f"shards/{b.name}.shard"
                plans.append((i, partial / rel, rel, stride, nbytes))
        try:
            return _write(out, partial, ext_name, mounts, feats, rows_u8, features_path, assignment, fmt, nodes,
                          starts, plans, plan, dataset_checksum, dataset_id, manifest_extra, progress, chunk_bytes,
                          batch_bytes, split)
        except BaseException as e:
            _recover(out, mounts, published)
            if isinstance(e, OSError):  # a full disk or a failing device: one message, nothing left behind
                raise _write_failure(e, out, [(bins[i].name, m) for i, m, _, _ in specs if m is not None]) from None
            raise


def _write_failure(e: OSError, out: Path, on_mounts: list[tuple[str, Path]]) -> MomentError:
    """The one line for an OSError while writing the layout: a file on an SSD mount (--ssd-path) names that file
    and its bins, not --out, whose file system may have plenty of room (a full SSD mount was blamed on --out)."""
    failed = Path(e.filename).absolute() if isinstance(e.filename, str) else None
    names = [name for name, m in on_mounts if failed is not None and failed.is_relative_to(m)]
    if not names:
        return write_error(e, failed or out, doing="cannot write the layout")
    mount = next(m for name, m in on_mounts if name == names[0])
    hint = (f"free some space on {mount}, or give {' and '.join(names)} another --ssd-path; nothing was left behind"
            if e.errno in (errno.ENOSPC, errno.EDQUOT) else None)
    return write_error(e, failed, what=f"--ssd-path {'/'.join(names)}", doing="cannot write the layout's shard",
                       hint=hint)


def _dataset_id_of(features_path: str | Path) -> str | None:
    """The id of the dataset whose features file this is (None for a bare .npy)."""
    p = Path(features_path).absolute()
    if not (p.parent / DATASET_MANIFEST).is_file():
        return None
    try:
        ds = GraphDataset.open(p.parent)
    except MomentError:
        return None
    return ds.dataset_id if ds.file("features").absolute() == p else None


def _write(out, partial, ext_name, mounts, feats, rows_u8, features_path, a, fmt, nodes, starts, plans, plan,
           dataset_checksum, dataset_id, manifest_extra, progress, chunk_bytes, batch_bytes, split) -> Path:
    n = int(feats.shape[0])
    total = sum(p[4] for p in plans) + (0 if dataset_checksum else Path(features_path).stat().st_size)
    w = _Writer(total, progress)
    if dataset_checksum is None:
        dataset_checksum = sha256_file(features_path, progress, 0, total)
        w.done = Path(features_path).stat().st_size
    partial.parent.mkdir(parents=True, exist_ok=True)
    make_partial(partial, out)  # marked as this write's from the start: the next writer knows it (and only it)
    (partial / "shards").mkdir()
    (partial / "lists").mkdir()
    for m in mounts:
        (m / (ext_name + ".partial")).mkdir()

    shards: list[Shard] = []
    batch_rows = max(1, batch_bytes // max(fmt.stride, fmt.row_bytes))
    for i, final, mpath, stride, nbytes in plans:
        b = a.bins[i]
        ids = nodes[starts[i] : starts[i + 1]]
        sums = w.shard(final, rows_u8, ids, stride, nbytes,
                       chunk_bytes, batch_rows)
        shards.append(Shard(bin=b.name, kind=b.kind, path=mpath, rows=int(ids.shape[0]), stride=stride,
                            bytes=nbytes, chunk_bytes=chunk_bytes, chunk_sha256=sums))

    index = np.full((n, 2), -1, dtype=np.int64)
    counts = np.diff(starts)
    index[nodes, 0] = np.repeat(np.arange(len(counts), dtype=np.int64), counts)  # a split's remote bins last
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
    order_sum = _save_npy(partial / ORDER, (a.order if split is None else split.order).astype(odt), ORDER)
    manifest = LayoutManifest(
        created_by=f"moment {moment.__version__}",
        plan=plan or PlanRef(policy=a.policy, pool=a.pool),
        dataset=DatasetRef(features_path=str(Path(features_path).absolute()), sha256=dataset_checksum,
                           id=dataset_id, num_nodes=n, row_shape=list(feats.shape[1:]), dtype=feats.dtype.str),
        row=fmt, bins=a.bins, shards=shards, index=index_sum, cache_lists=lists, order_file=order_sum,
        extra=manifest_extra or {}, split=split.ref if split is not None else None,
    )
    with atomic_file(partial / MANIFEST, text=True) as f:
        f.write(sealed(manifest).model_dump_json(indent=1))
    for d in (partial, partial / "shards", partial / "lists"):
        fsync_dir(d)
    testpoints.reach("layout-written")
    # commit: the new SSD directories get their final (new) names; the old layout still points to its own
    for m in mounts:
        fsync_dir(m / (ext_name + ".partial"))
        os.rename(m / (ext_name + ".partial"), m / ext_name)
        fsync_dir(m)
    testpoints.reach("layout-shards-renamed")
    if exists(out):
        mark_leftover(out, out)  # the old layout, about to be LAYOUT.partial or LAYOUT.old: ours to remove
    old = publish_dir(partial, out, "layout", aside=out.with_name(out.name + ".old"))  # the one atomic step
    (out / LEFTOVER_MARK).unlink(missing_ok=True)
    if old is None:
        return out
    # the new layout is in place: only now does the old one go, its SSD directories first
    _, _, stem = _layout_paths(out)
    keep = _referenced_dirs(out)
    _remove(sorted(d for d in _referenced_dirs(old) if d not in keep and _owned(stem, d.name)))
    testpoints.reach("layout-old-shards-removed")
    _remove([old])
    fsync_dir(out.parent)
    return out


# ---- removal ---------------------------------------------------------------------------------------


class RemoveReport(BaseModel):
    layout: str
    removed_dirs: list[str] = Field(description="the layout directory, then each shard directory on an SSD mount "
                                                "(`moment layout rm` adds LAYOUT.runs, the layout's training runs)")
    files: int
    bytes: int


def remove_layout(path: str | Path) -> RemoveReport:
    """Remove the layout at `path` and every shard directory it owns, as its manifest records.

    Checks everything before deleting anything, and refuses what the layout does not own: a directory
    that is not a Moment layout, a file in it that its manifest does not name, a shard directory that
    was not written for a layout at this path (a copied or moved layout), or one holding files the
    manifest does not name. Holds the layout's lock (a layout being written is refused). The layout
    disappears first, in one rename; leftovers of a crash are removed by the next write or rm.
    """
    given = Path(path)
    out = given.absolute()
    with locked(out, "layout"):
        m = load_manifest(given, own_checksum=False)  # refuses what is not a Moment layout; an edited one is removed
        _recover(out, [])  # a crashed write's leftovers go too
        files, ext = _owned_files(out, m)
        partial, _, _ = _layout_paths(out)
        size = sum(f.stat().st_size for f in files)
        mark_leftover(out, out)  # what a kill leaves at LAYOUT.partial is known as ours
        os.rename(out, partial)  # from here on there is no layout at `path`
        fsync_dir(out.parent)
        for d, names in ext.items():
            for name in names:
                (d / name).unlink(missing_ok=True)
            try:
                d.rmdir()
            except OSError as e:
                raise MomentError(f"cannot remove shard directory ({e.strerror})", source=str(d)) from None
            fsync_dir(d.parent)
        shutil.rmtree(partial)
        fsync_dir(out.parent)
    return RemoveReport(layout=str(given), removed_dirs=[str(given), *map(str, ext)], files=len(files), bytes=size)


def layout_files(out: Path, m: LayoutManifest) -> set[str]:
    """The paths (relative to the layout) of every file the manifest puts inside the layout at `out`."""
    return _inside(out, m)


def _inside(out: Path, m: LayoutManifest) -> set[str]:
    """The layout-relative paths of every file the manifest puts inside the layout (its pack included);
    raises MomentError for a name that points outside it."""
    inside = {MANIFEST, LEFTOVER_MARK, m.index.path, *(f.path for f in m.cache_lists.values())}
    inside |= {m.order_file.path} if m.order_file else set()
    inside |= pack_files(out)
    inside |= {s.path for s in m.shards if not Path(s.path).is_absolute()}
    root = out.resolve()
    for rel in inside:
        q = (out / rel).resolve()
        if Path(rel).is_absolute() or root not in q.parents:
            raise MomentError(f"the manifest names {rel!r}, which is outside the layout: refusing to remove it",
                              source=str(out / MANIFEST))
    return inside


def _owned_files(out: Path, m: LayoutManifest) -> tuple[list[Path], dict[Path, set[str]]]:
    """Every file to delete (existing ones) and the shard directories on mounts with their file names;
    raises MomentError for anything the layout does not own."""
    inside = _inside(out, m)
    ext: dict[Path, set[str]] = {}
    for s in m.shards:
        p = Path(s.path)
        if p.is_absolute():
            ext.setdefault(p.parent, set()).add(p.name)
    check_replaceable(out, "layout", inside, verb="remove", hint=None)
    files = [p for p in sorted(out.rglob("*")) if not (p.is_dir() and not p.is_symlink())]
    root = out.resolve()
    stems = {_layout_paths(out)[2], _layout_paths(root)[2]}
    for d, names in ext.items():
        if not any(_owned(stem, d.name) and not d.name.endswith(".partial") for stem in stems):
            raise MomentError(f"shard directory {d} was not written for a layout at {out} (a copied or moved "
                              "layout?): refusing to remove it", source=str(out / MANIFEST))
        if not d.exists():
            continue
        if d.is_symlink() or not d.is_dir():
            raise MomentError("shard path is not a directory Moment wrote: refusing to remove it", source=str(d))
        extra = unnamed_entries(d, names)
        if extra:
            raise MomentError(f"shard directory holds {extra[0]}, which the layout's manifest does not name: "
                              "refusing to remove it", source=str(d))
        files += sorted(d.iterdir())
    return files, {d: names for d, names in ext.items() if d.exists()}
