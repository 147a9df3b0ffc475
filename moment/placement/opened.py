"""A layout opened once for a run: its manifest, its pack's manifest, and the sizes a run plan needs.

Why one object: a run's start used to read the layout manifest in five places and the pack manifest in
three (the launcher, the device match, the dataset check, the memory split, the store). Each read is
a chance to see another version of a layout being rewritten, and each caller re-derived what the
others had. `Layout.open` reads the manifest once; the pack manifest is read once, the first time
it is asked for (a run that never reads the pack never parses it). Also the owner of the compact
node -> (bin, slot) index the runtime keeps in memory, so the memory budget asks it for its size.
No torch here: the run plan (moment.runtime.run_plan) is resolved from this object on a laptop.

The index can be loaded once for every rank of a machine: torchrun's agent keeps it (`keep_index`) before it
forks the ranks, and a rank's `load_index` then returns that copy, whose pages the machine holds once, instead
of reading and checking the file itself (each rank dropped the file's pages, so the next rank read it from disk
again).

It also knows the dataset it was placed from (`dataset_dir`, `dataset`): the one rule by which a command
given no --dataset finds it, and refuses one that was moved, deleted or replaced by another.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.inputs import why as reason
from moment.io.files import file_identity, forget_pages, npy_header
from moment.placement.manifest import LayoutManifest, Shard, SplitRef
from moment.placement.pack import PackManifest, load_pack, pack_index_bytes
from moment.placement.reader import (IndexCheck, bin_rows, check_dataset, damaged, load_manifest, order_form_problem,
                                     order_problem, shard_path)
from moment.workload.graph import MANIFEST as DATASET_MANIFEST
from moment.workload.graph import GraphDataset


def index_dtypes(shards: int, most_rows: int) -> tuple[np.dtype, np.dtype]:
    """(bin, slot) dtypes of a layout's in-memory index with `shards` bins, the largest of `most_rows` rows."""
    return (np.dtype(np.uint8 if shards < 256 else np.int16), np.dtype(np.int32 if most_rows < 2**31 else np.int64))


#: indexes loaded for the ranks this process forks (`Layout.keep_index`), by their file's identity (`_index_key`)
_KEPT: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


@dataclass(frozen=True, eq=False)
class Layout:
    path: Path
    manifest: LayoutManifest

    @classmethod
    def open(cls, path: str | Path) -> Layout:
        return cls(Path(path), load_manifest(path))

    # ------------------------------------------------------------------ the pack

    @functools.cached_property
    def pack(self) -> PackManifest | None:
        """The pack's manifest (None: the layout has none), read once."""
        return load_pack(self.path)

    @functools.cached_property
    def pack_index_bytes(self) -> int:
        """What one rank holds of the pack's index (the largest rank's: every rank sizes its caches alike)."""
        return 0 if self.pack is None else pack_index_bytes(self.path, self.pack)

    # ------------------------------------------------------------------ the dataset

    @property
    def dataset_dir(self) -> Path:
        """The directory of the dataset this layout was placed from (its features file's), refused when no
        dataset is there any more: a command given no --dataset says so instead of failing on a missing file."""
        ref = self.manifest.dataset
        feats = Path(ref.features_path)
        d = feats.parent
        if (d / DATASET_MANIFEST).is_file():
            return d
        if feats.is_file():
            why = f"it was placed from the features file {feats}, which is not in a dataset directory"
        else:
            why = f"the dataset it was placed from is no longer at {d} (moved or deleted)"
        raise MomentError(f"{why}: the layout cannot find its dataset", source=str(self.path),
                          hint="give the dataset's directory where it is now (--dataset DIR), or place the layout "
                               "again")

    @functools.cached_property
    def dataset(self) -> GraphDataset:
        """The dataset this layout was placed from, opened once and checked to be that dataset (its id, or
        for older layouts its features checksum: `check_dataset`): another dataset written to the same
        directory is refused, not read beside rows that are not its own."""
        ds = GraphDataset.open(self.dataset_dir)
        feats = Path(self.manifest.dataset.features_path)
        if ds.file("features").resolve() != feats.resolve():
            raise MomentError(f"it was placed from {feats}, which is not the features file of the dataset at "
                              f"{ds.path} ({ds.file('features')})", source=str(self.path),
                              hint="give the dataset's directory (--dataset DIR), or place the layout again")
        check_dataset(self.path, self.manifest, ds)
        return ds

    # ------------------------------------------------------------------ shapes

    @property
    def num_nodes(self) -> int:
        return self.manifest.dataset.num_nodes

    @property
    def row_bytes(self) -> int:
        return self.manifest.row.row_bytes

    @property
    def split(self) -> SplitRef | None:
        """This machine's part of a split layout (None: every row is here)."""
        return self.manifest.split

    @property
    def nbins(self) -> int:
        """Bins the index numbers: the shards, then a split layout's remote bins (one per other machine)."""
        return len(self.manifest.shards) + (len(self.split.remote) if self.split else 0)

    @property
    def cpu_bin_rows(self) -> int:
        """Rows of the layout's CPU bins: the CPU cache its placement planned, which a store or run given no
        memory budget holds (never every row: a layout is out of core by design)."""
        return sum(self.manifest.shards[i].rows for i in self.shards_of("cpu"))

    def shards_of(self, kind: str) -> list[int]:
        """Indices of the shards of one kind ("gpu", "cpu", "ssd"), in layout order."""
        return [i for i, s in enumerate(self.manifest.shards) if s.kind == kind]

    def shard_file(self, s: Shard) -> Path:
        return shard_path(self.path, s)

    def check_files(self) -> None:
        """Every file a run reads is there (the index, the hotness order, the cache bins' node lists) and every
        shard has the size its manifest records: one MomentError naming the first that is not. The launcher
        checks it before any rank starts (and a dry run with it: a layout without its index.npy was planned,
        and trained as one FileNotFoundError traceback per rank); each rank's disk tier again."""
        m = self.manifest
        smalls = [("index", m.index), *((f"node list of bin {name}", f) for name, f in m.cache_lists.items())]
        if m.order_file is not None:
            smalls.append(("hotness order", m.order_file))
        for what, f in smalls:
            fp = self.path / f.path
            if not fp.is_file():
                raise MomentError(f"the layout's {what} is missing", source=str(fp),
                                  hint="the layout is incomplete (a partial copy?): run `moment layout verify`, "
                                       "and place it again")
        for s in m.shards:
            fp = self.shard_file(s)
            if not fp.is_file():
                raise MomentError(f"{s.kind} shard of bin {s.bin} is missing", source=str(fp),
                                  hint="the layout is incomplete or its SSD is not mounted")
            size = fp.stat().st_size
            if size != s.bytes:
                raise MomentError(f"shard of bin {s.bin}: size {size} B, manifest says {s.bytes} B",
                                  source=str(fp), hint="the shard was truncated or replaced; rewrite the layout")

    def gpu_devices(self) -> list[tuple[str, str | None]]:
        """The layout's GPU bins as (plan GPU, PCI address), in shard order: what ranks are matched to."""
        m = self.manifest
        bins = {b.name: b for b in m.bins}
        out = []
        for i in self.shards_of("gpu"):
            s = m.shards[i]
            b = bins.get(s.bin)
            out.append((b.device if b is not None and b.device else s.bin.removeprefix("hbm:"),
                        b.pci if b is not None else None))
        return out

    # ------------------------------------------------------------------ the compact index

    def index_dtypes(self) -> tuple[np.dtype, np.dtype]:
        """(bin, slot) dtypes of the in-memory index: the smallest that hold every bin and slot."""
        rows = bin_rows(self.manifest)
        return index_dtypes(len(rows), max(rows, default=0))

    @property
    def index_bytes(self) -> int:
        """Bytes `load_index` holds: what the memory budget charges for the index."""
        b, s = self.index_dtypes()
        return self.num_nodes * (b.itemsize + s.itemsize)

    def _index_key(self) -> tuple | None:
        """What a kept index is kept under: the file (its inode, size and time: a layout placed again is a new
        file) and the manifest's checksum of it, which the kept copy was checked against. None: no file."""
        found = file_identity(self.path / self.manifest.index.path)
        return None if found is None else (*found, self.manifest.index.sha256, self.num_nodes, self.index_dtypes())

    @property
    def index_kept(self) -> bool:
        """Whether `load_index` returns a copy this process was forked with (or kept itself), held once."""
        return bool(_KEPT) and self._index_key() in _KEPT

    def keep_index(self) -> None:
        """Load and check the index once, for the processes this one forks: their `load_index` returns this copy
        (read-only: a write would copy the page into the rank that made it), so its pages are shared."""
        key = self._index_key()
        if key is None or key in _KEPT:
            return
        bins, slots = self._read_index()
        bins.flags.writeable = slots.flags.writeable = False
        _KEPT[key] = bins, slots

    def load_index(self) -> tuple[np.ndarray, np.ndarray]:
        """The node -> (bin, slot) index as two compact arrays (6 B/node, not 16): the copy kept for this
        machine's ranks when there is one (`keep_index`), else read and checked here."""
        if _KEPT and (kept := _KEPT.get(self._index_key())) is not None:
            return kept
        return self._read_index()

    def _read_index(self) -> tuple[np.ndarray, np.ndarray]:
        """The index read into arrays this process owns, checked as it streams in: an edited index is one
        clear error before a row is read through it."""
        path = self.path / self.manifest.index.path
        n = self.num_nodes
        try:
            f = open(path, "rb")  # read, not mapped: the file's pages never count in this process's memory
        except OSError as e:  # a user's open_run on a layout that lost it (moment train checks before, check_files)
            raise MomentError(f"cannot read the layout's index: {reason(e)}", source=str(path),
                              hint="run `moment layout verify`, and place the layout again") from None
        with f:
            try:
                shape, fortran, dtype = npy_header(f)
            except ValueError as e:
                raise damaged("index", f"not a numpy array file ({e})", path) from None
            if shape != (n, 2) or dtype.kind not in "iu" or fortran:
                got = f"{dtype} {shape}{' in Fortran order' if fortran else ''}"
                raise damaged("index", f"expected an integer ({n}, 2) array, got {got}", path)
            bd, sd = self.index_dtypes()
            bins, slots = np.empty(n, bd), np.empty(n, sd)
            check = IndexCheck(self.manifest)
            buf = np.empty((min(n, 1 << 18), 2), dtype)  # one block of rows at a time
            raw = memoryview(buf.view(np.uint8).reshape(-1))
            for a in range(0, n, buf.shape[0]):
                blk = buf[:min(buf.shape[0], n - a)]
                if (got := f.readinto(raw[:blk.nbytes])) != blk.nbytes:
                    raise damaged("index", f"the file ends after {a + got // buf[0].nbytes} of its {n} nodes", path)
                check.add(a, blk)
                bins[a:a + blk.shape[0]] = blk[:, 0]
                slots[a:a + blk.shape[0]] = blk[:, 1]
        forget_pages(path)  # read once: copied into the compact arrays the budget charges
        if why := check.problem():
            raise damaged("index", why, path)
        return bins, slots

    def hot_order(self, limit: int | None = None) -> np.ndarray:
        """Node ids hottest first (the layout's pre-sampled order), the first `limit` of them."""
        m = self.manifest
        if m.order_file is not None:
            f = self.path / m.order_file.path
            with open(f, "rb") as fh:  # read into the copy, not mapped: a mapping's pages would count beside it
                try:
                    shape, _, dtype = npy_header(fh)
                except ValueError as e:
                    raise damaged("hotness order", f"unreadable ({e})", f) from None
                if why := order_form_problem(shape, dtype, m.dataset.num_nodes):
                    raise damaged("hotness order", why, f)
                out = np.empty(shape, dtype)
                if (got := fh.readinto(out.view(np.uint8))) != out.nbytes:
                    raise damaged("hotness order", f"unreadable (the file ends {got} bytes into its "
                                                   f"{out.nbytes} bytes of node ids)", f)
            forget_pages(f)  # read once: the copy is what is held
            if why := order_problem(out, m.dataset.num_nodes):
                raise damaged("hotness order", why, f)
            return out[:limit].copy() if limit is not None else out
        # older layouts: cache bins in list order, then SSD rows by slot (each shard is hottest first)
        idx = np.load(self.path / m.index.path, mmap_mode="r")
        parts = [np.load(self.path / f.path) for f in m.cache_lists.values()]
        ssd = np.array([s.kind == "ssd" for s in m.shards])
        b = np.asarray(idx[:, 0])
        on = np.flatnonzero(ssd[b])
        parts.append(on[np.lexsort((b[on], np.asarray(idx[on, 1])))])
        out = np.concatenate(parts).astype(np.int64)
        return out[:limit] if limit is not None else out
