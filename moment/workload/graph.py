"""A graph dataset on disk: CSR adjacency, node features, labels and splits as memory-mappable `.npy` files.

Why this shape: training reads features out of core, so every array is a plain `.npy` that
`np.load(mmap_mode="r")` maps without copying, and `manifest.json` (written last) records sizes and
sha256 sums so a half-written or tampered directory is refused instead of silently trained on.

Layout of a dataset directory::

    manifest.json      schema version, counts, dtypes, per-file bytes, sha256 and per-block sha256
    indptr.npy         int64 [num_nodes + 1]; row v = in-neighbours of v (the nodes v aggregates from)
    indices.npy        int32 (int64 when num_nodes >= 2**31) [num_edges]
    features.npy       float32 or float16 [num_nodes, feature_dim], row-major
    labels.npy         int16/int32/int64 [num_nodes]; -1 = unlabelled; or, multi-label, uint8
                       [num_nodes, num_classes] of 0/1 (a node may have several classes, or none)
    train_idx.npy, val_idx.npy, test_idx.npy   int64 node ids

An edge u -> v is stored in row v (indices[indptr[v]:indptr[v+1]] contains u), so sampling row v gives
the nodes whose features v's GNN layer reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moment import testpoints
from moment.documents import mistaken, mistaken_dir
from moment.errors import MomentError, validation_error
from moment.locking import locked
from moment.inputs import check_dir, read_text
from moment.io.files import file_identity
from moment.workload.renumber import IdMap
from moment.outputs import (
    ChunkHasher,
    bad_chunk,
    atomic_file,
    check_output,
    check_replaceable,
    follow_umask,
    manifest_head,
    publish_dir,
    reason,
    remove_stale,
    temp_prefix,
    write_error,
    writing,
)
from moment.sizes import fmt_size

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
FORMAT = "moment-graph"
SPLITS = ("train", "val", "test")
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")
#: the optional array of the graph's own node ids (`--renumber`, `--node-ids`): node i's is the i-th
NODE_IDS = "node_ids"
FEATURE_DTYPES = ("float32", "float16")
LABEL_DTYPES = ("int16", "int32", "int64")
#: a multi-label dataset's labels: one 0/1 byte a node and class
MULTILABEL_DTYPE = "uint8"
INDEX_DTYPES = ("int32", "int64")
CHUNK_BYTES = 64 << 20  # streaming granularity for hashing and validation
SPOT_BLOCKS = 1024  # most blocks a file's block checksums cut it into
#: nodes whose degrees are read at once (`degree_histogram`): 32 MiB of indptr
DEGREE_CHUNK = 1 << 22
SPOT_CHECKED = 4  # blocks per file `spot_check` re-hashes: the first, the last and two between
#: set by a launcher that ran `check` for the processes it starts (`moment train` for its ranks, torchrun's agent
#: with --preload-index for a script's): the `identity` of the dataset it checked, so that a rank opening that
#: dataset, unchanged, does not read and check it again (`check(checked)`)
CHECKED_ENV = "MOMENT_DATASET_CHECKED"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class FileRecord(BaseModel):
    """One array file: what the manifest promises about it."""

    model_config = ConfigDict(extra="forbid")

    file: str
    dtype: str
    shape: list[int]
    bytes: int = Field(ge=0)
    sha256: str
    block_bytes: int | None = Field(None, gt=0, description="size of the blocks `block_sha256` hashes")
    block_sha256: list[str] | None = Field(
        None, description="sha256 of each block: `spot_check` re-hashes a few without reading the whole file "
                          "(absent in datasets written before them)")


class DatasetManifest(BaseModel):
    """The contract of a dataset directory; a directory without one is not a dataset."""

    model_config = ConfigDict(extra="forbid")

    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION
    name: str = ""
    num_nodes: int = Field(gt=0)
    num_edges: int = Field(ge=0)
    feature_dim: int = Field(gt=0)
    feature_dtype: str
    num_classes: int = Field(gt=0)
    files: dict[str, FileRecord]
    source: dict[str, Any] = Field(default_factory=dict, description="how it was made (generator, importer)")


def block_bytes(file_bytes: int) -> int:
    """The block size `block_sha256` uses for a file this large: at most SPOT_BLOCKS blocks (a manifest of
    some KiB per file), none smaller than 1 MiB."""
    return max(1 << 20, -(-file_bytes // SPOT_BLOCKS // (1 << 20)) * (1 << 20))


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 neighbour ids halve the adjacency size; int64 only when ids do not fit."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


#: the most classes a dataset may have: a label past it is a sentinel or a mistake (uint32's 4,294,967,295 made
#: an output layer of 4.3 billion classes), not a class
MAX_CLASSES = 1 << 24


def label_dtype(num_classes: int, multilabel: bool = False) -> np.dtype:
    if multilabel:
        return np.dtype(MULTILABEL_DTYPE)
    return np.dtype(np.int16) if num_classes < 2**15 else np.dtype(np.int64)


# --------------------------------------------------------------------------------------------- writing


def _npy_header(dtype: np.dtype, shape: tuple[int, ...], reserve: int = 0) -> bytes:
    """A version-1 `.npy` header; `reserve` pads it to that many bytes so it can be rewritten in place."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    body = repr(d).encode("latin1")
    total = 10 + len(body) + 1
    target = max(reserve, total)
    target = -(-target // 64) * 64
    body = body + b" " * (target - total) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class NpyStreamWriter:
    """Writes a `.npy` file chunk by chunk (rows along axis 0), hashing as it goes.

    With `rows=None` the row count is unknown up front: the header is reserved, rewritten on close,
    and the hash is computed by re-reading the file (still chunked).
    """

    def __init__(self, path: Path, dtype: Any, row_shape: tuple[int, ...] = (), rows: int | None = None):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(x) for x in row_shape)
        self.rows = rows
        self.written = 0
        self._f = open(self.path, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._hash = hashlib.sha256() if rows is not None else None
        head_rows = rows if rows is not None else 2**62  # widest header we could need
        self._header = _npy_header(self.dtype, (head_rows, *self.row_shape))
        row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._blocks = (ChunkHasher(block_bytes(len(self._header) + rows * row_bytes))
                        if rows is not None else None)
        self._put(self._header)

    def _put(self, b: bytes | memoryview) -> None:
        self._f.write(b)
        if self._hash is not None and self._blocks is not None:  # rows known up front
            self._hash.update(b)
            self._blocks.update(b)

    def write(self, chunk: np.ndarray) -> None:
        a = np.ascontiguousarray(chunk, dtype=self.dtype)
        if a.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: chunk row shape {a.shape[1:]} != {self.row_shape}")
        if self.rows is not None and self.written + a.shape[0] > self.rows:
            raise ValueError(f"{self.path.name}: more rows than the declared {self.rows}")
        if a.size == 0:  # (a memoryview of no bytes cannot be cast: an edge list of a header alone spooled one)
            return
        self._put(memoryview(a).cast("B"))
        self.written += a.shape[0]

    def close(self) -> FileRecord:
        if self.rows is not None and self.written != self.rows:
            self._f.close()
            raise ValueError(f"{self.path.name}: wrote {self.written} rows, declared {self.rows}")
        if self.rows is None:
            header = _npy_header(self.dtype, (self.written, *self.row_shape), reserve=len(self._header))
            assert len(header) == len(self._header)
            self._f.seek(0)
            self._f.write(header)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        if self._hash is not None and self._blocks is not None:
            digest, blocks, size = self._hash.hexdigest(), self._blocks.finish(), self._blocks.chunk
        else:
            digest, blocks, size = hash_blocks(self.path)
        return FileRecord(
            file=self.path.name,
            dtype=self.dtype.name,
            shape=[self.written, *self.row_shape],
            bytes=self.path.stat().st_size,
            sha256=digest,
            block_bytes=size,
            block_sha256=blocks,
        )

    def abort(self) -> None:
        if not self._f.closed:
            try:
                self._f.close()
            except OSError:  # flushing the buffer fails the same way the write did (a full disk)
                pass


def hash_blocks(path: Path) -> tuple[str, list[str], int]:
    """(sha256, block sha256s, block size) of a file, in one streaming read."""
    size = block_bytes(path.stat().st_size)
    whole, blocks = hashlib.sha256(), ChunkHasher(size)
    with open(path, "rb") as f:
        while b := f.read(size):
            whole.update(b)
            blocks.update(b)
    return whole.hexdigest(), blocks.finish(), size


class GraphWriter:
    """Builds a dataset in a hidden temp directory next to `out_dir` and renames it into place on commit.

    Usage::

        with GraphWriter(out) as w:
            w.write_array("indptr", indptr)
            fw = w.stream("features", np.float32, (dim,), rows=n)  # then fw.write(chunk) ...
            ds = w.commit(num_classes=..., feature_dim=...)

    The manifest is the last file written; leaving the block without `commit` (or on an exception)
    deletes the temp directory, so nothing half-written ever appears at `out_dir`.
    """

    def __init__(self, out_dir: str | Path, *, overwrite: bool = False, name: str = ""):
        self.out_dir = Path(out_dir)
        self.name = name or self.out_dir.name
        # held until commit/abort: a second writer of the same directory is refused, naming this one
        check_output(self.out_dir, directory=True)
        self._lock = ExitStack()
        self._lock.enter_context(locked(self.out_dir, "dataset"))
        try:
            remove_stale(self.out_dir, set_aside=True)  # a killed writer's leftovers (we hold the lock)
            check_overwrite(self.out_dir, overwrite)
            self.overwrite = overwrite
            with writing(self.out_dir):
                self.out_dir.parent.mkdir(parents=True, exist_ok=True)
                self.tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out_dir), dir=self.out_dir.parent))
                follow_umask(self.tmp, directory=True)
        except BaseException:
            self._lock.close()
            raise
        self.records: dict[str, FileRecord] = {}
        self._open: dict[str, NpyStreamWriter] = {}
        self._done = False
        # the arrays whose size is known when they are opened, against the disk's free space at the start: a
        # dataset far larger than the disk is refused at once, not after filling it for minutes
        self._free, self._known = shutil.disk_usage(self.tmp).free, {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if not self._done:
            self.abort()
        if isinstance(exc, OSError):  # a full disk, or an input that cannot be read: one message
            if exc.filename is None or self._ours(Path(exc.filename)):
                raise write_error(exc, self.out_dir, doing="cannot write the dataset") from None
            raise MomentError(f"cannot read: {reason(exc)}", source=str(exc.filename)) from None

    def _ours(self, p: Path) -> bool:
        """Is `p` the output, its temporary directory or something in them (not an input file)?"""
        p, out = p.absolute(), self.out_dir.absolute()
        return p == out.parent or p.name.startswith(f".{out.name}.") or any(
            p.is_relative_to(d) for d in (out, Path(getattr(self, "tmp", out)).absolute()))

    def reserve(self, name: str, nbytes: int) -> None:
        """Array `name` will take `nbytes`: refused at once when the arrays known so far are more than the disk had
        free at the start (a writer that knows a size before it computes the array says it first)."""
        self._known[name] = max(self._known.get(name, 0), int(nbytes))
        known = sum(self._known.values())
        if known > self._free:
            raise MomentError(
                f"the dataset needs at least {fmt_size(known)} ({name}: {fmt_size(self._known[name])}), and the disk "
                f"holding {self.out_dir.parent} has {fmt_size(self._free)} free", source=str(self.out_dir),
                hint="free some space or choose another output location; nothing was left behind")

    def path(self, name: str) -> Path:
        return self.tmp / f"{name}.npy"

    def stream(self, name: str, dtype: Any, row_shape: tuple[int, ...] = (), rows: int | None = None) -> NpyStreamWriter:
        if rows is not None:
            self.reserve(name, int(rows) * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        w = NpyStreamWriter(self.path(name), dtype, row_shape, rows)
        self._open[name] = w
        return w

    def finish(self, name: str) -> FileRecord:
        rec = self._open.pop(name).close()
        self.records[name] = rec
        return rec

    def write_array(self, name: str, array: np.ndarray, dtype: Any = None, chunk_rows: int | None = None) -> FileRecord:
        a = np.asarray(array)
        dt = np.dtype(dtype) if dtype is not None else a.dtype
        w = self.stream(name, dt, a.shape[1:], rows=a.shape[0])
        row_bytes = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * dt.itemsize)
        step = chunk_rows or max(1, CHUNK_BYTES // row_bytes)
        for s in range(0, a.shape[0], step):
            w.write(a[s : s + step])
        return self.finish(name)

    def commit(
        self,
        *,
        num_classes: int,
        source: dict[str, Any] | None = None,
        validate: bool = True,
    ) -> GraphDataset:
        """Checks the arrays, writes the manifest last, fsyncs and renames the directory into place."""
        if self._open:
            raise ValueError(f"streams still open: {sorted(self._open)}")
        missing = [a for a in ARRAYS if a not in self.records]
        if missing:
            raise ValueError(f"arrays not written: {missing}")
        r = self.records
        manifest = DatasetManifest(
            name=self.name,
            num_nodes=r["indptr"].shape[0] - 1,
            num_edges=r["indices"].shape[0],
            feature_dim=r["features"].shape[1] if len(r["features"].shape) == 2 else 0,
            feature_dtype=r["features"].dtype,
            num_classes=num_classes,
            files=dict(r),
            source=source or {},
        )
        ds = GraphDataset(self.tmp, manifest)
        ds.check_files()
        if validate:
            ds.validate()
        with atomic_file(self.tmp / MANIFEST, text=True) as f:
            f.write(manifest.model_dump_json(indent=2))
        testpoints.reach("dataset-written")
        if self.out_dir.exists():
            check_overwrite(self.out_dir, self.overwrite)  # still only what was checked at the start
        old = publish_dir(self.tmp, self.out_dir, "dataset")  # a crash: the next writer's remove_stale cleans up
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._done = True
        try:
            return GraphDataset.open(self.out_dir)
        finally:
            self._lock.close()

    def abort(self) -> None:
        for w in self._open.values():
            w.abort()
        self._open.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._done = True
        self._lock.close()


def owned_entries(path: str | Path) -> set[str] | None:
    """The entries of the dataset directory `path` that its writer made (the manifest and the files it
    names); None when `path` holds no manifest a dataset writer wrote."""
    head = manifest_head(path, MANIFEST)
    if head is None or head.get("format") != FORMAT or not isinstance(head.get("files"), dict):
        return None
    files = [r.get("file") for r in head["files"].values() if isinstance(r, dict)]
    return {MANIFEST, *(f for f in files if isinstance(f, str) and "/" not in f)}


def check_overwrite(path: Path, overwrite: bool) -> None:
    """An existing --out is replaced only with --overwrite, and only when it is an empty directory or a
    dataset holding nothing but its own files (never a directory that merely has a manifest.json)."""
    if not path.exists() and not path.is_symlink():
        return
    if not overwrite:
        raise MomentError("output directory already exists", source=str(path),
                          hint="choose another --out or pass --overwrite")
    check_replaceable(path, "dataset", owned_entries(path))


def write_graph(
    out_dir: str | Path,
    *,
    indptr: np.ndarray,
    indices: np.ndarray,
    features: np.ndarray,
    labels: np.ndarray,
    train_idx: np.ndarray,
    val_idx: np.ndarray,
    test_idx: np.ndarray,
    num_classes: int | None = None,
    overwrite: bool = False,
    name: str = "",
    source: dict[str, Any] | None = None,
) -> GraphDataset:
    """Writes in-memory (or memory-mapped) arrays as a dataset; dtypes are normalised to the format's."""
    n = int(np.asarray(indptr).shape[0]) - 1
    labels = np.asarray(labels)
    if num_classes is None:
        num_classes = labels.shape[1] if labels.ndim == 2 else int(labels.max()) + 1 if labels.size else 1
    fdt = np.dtype(features.dtype)
    if fdt.name not in FEATURE_DTYPES:
        fdt = np.dtype(np.float32)
    with GraphWriter(out_dir, overwrite=overwrite, name=name) as w:
        w.write_array("indptr", indptr, np.int64)
        w.write_array("indices", indices, index_dtype(n))
        w.write_array("features", features, fdt)
        w.write_array("labels", labels, label_dtype(num_classes, labels.ndim == 2))
        for split, arr in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
            w.write_array(f"{split}_idx", np.asarray(arr), np.int64)
        return w.commit(num_classes=num_classes, source=source)


# --------------------------------------------------------------------------------------------- reading


@dataclass
class GraphDataset:
    """An opened dataset directory. Arrays are memory-mapped read-only on first use.

    `open()` checks the manifest, file presence, sizes and `.npy` headers, and the O(1) CSR
    invariants; `open(verify=True)` (or `verify()`) also re-hashes every file and runs the full
    chunked validation (monotone indptr, neighbour ids, labels and split ids in range).
    """

    path: Path
    manifest: DatasetManifest

    @classmethod
    def open(cls, path: str | Path, verify: bool = False) -> GraphDataset:
        if not isinstance(path, str | os.PathLike):
            raise MomentError(f"a dataset is opened by its directory's path, not {type(path).__name__}")
        p = Path(path)
        mpath = p / MANIFEST
        check_dir(p, "dataset directory")
        if not mpath.is_file():
            raise mistaken_dir(p, "dataset") or MomentError(
                "no manifest.json: not a dataset, or an interrupted write", source=str(p),
                hint="create datasets with `moment data synth` or `moment data import`",
            )
        try:
            raw = json.loads(read_text(mpath, "dataset manifest"))
        except (json.JSONDecodeError, RecursionError) as e:
            raise MomentError(f"unreadable manifest: {e}", source=str(mpath)) from None
        if isinstance(raw, dict) and raw.get("format", FORMAT) != FORMAT:
            raise mistaken(raw, "dataset", str(p)) or MomentError(
                f"format is {raw.get('format')!r}, expected {FORMAT!r}", source=str(mpath))
        if isinstance(raw, dict) and raw.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise MomentError(
                f"schema_version {raw.get('schema_version')} is not supported (this build reads {SCHEMA_VERSION})",
                source=str(mpath),
            )
        try:
            manifest = DatasetManifest.model_validate(raw)
        except ValidationError as e:
            raise validation_error(e, "invalid manifest field", source=str(mpath)) from None
        ds = cls(p, manifest)
        ds.check_files()
        if verify:
            ds.verify()
        return ds

    # -- properties

    @property
    def num_nodes(self) -> int:
        return self.manifest.num_nodes

    @property
    def num_edges(self) -> int:
        return self.manifest.num_edges

    @property
    def feature_dim(self) -> int:
        return self.manifest.feature_dim

    @property
    def feature_dtype(self) -> np.dtype:
        return np.dtype(self.manifest.feature_dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one node's feature vector (the unit the placement and I/O layers move)."""
        return self.feature_dim * self.feature_dtype.itemsize

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    def file(self, name: str) -> Path:
        return self.path / self.manifest.files[name].file

    def _load(self, name: str) -> np.ndarray:
        cache = self.__dict__.setdefault("_arrays", {})
        if name not in cache:
            try:
                cache[name] = np.load(self.file(name), mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise MomentError(f"cannot map array: {e}", source=str(self.file(name))) from None
        return cache[name]

    @property
    def indptr(self) -> np.ndarray:
        return self._load("indptr")

    @property
    def indices(self) -> np.ndarray:
        return self._load("indices")

    @property
    def multilabel(self) -> bool:
        """Whether a node has a 0/1 target a class ([N, C] labels: PPI, Yelp, ogbn-proteins) rather than one
        class ([N]); read from the manifest, so the labels are not loaded to tell."""
        return len(self.manifest.files["labels"].shape) == 2

    @property
    def labels(self) -> np.ndarray:
        return self._load("labels")

    @property
    def node_ids(self) -> np.ndarray | None:
        """The graph's own id of each node (integers or names), when its import numbered them; else None (the
        ids are the node numbers)."""
        return self._load(NODE_IDS) if NODE_IDS in self.manifest.files else None

    @property
    def class_names(self) -> list[str] | None:
        """The name of each class (class i is the i-th) when the import read labels as names; else None."""
        names = self.manifest.source.get("class_names")
        return list(names) if isinstance(names, list) else None

    def nodes_of(self, ids: Any) -> np.ndarray:
        """The node numbers of the graph's own ids (what `node_ids` maps back): ids it does not hold are one
        error naming them. Without `node_ids`, the ids are the numbers, checked to be in range."""
        if NODE_IDS not in self.manifest.files:
            a = np.asarray(ids)
            if a.size == 0:  # [] is float64 to NumPy: an empty selection, not float ids
                return np.zeros(a.shape, np.int64)
            if a.dtype.kind not in "iu":
                raise MomentError(f"this dataset's nodes are numbered 0..{self.num_nodes - 1} (it keeps no ids of "
                                  f"its own), got {a.dtype} ids", source=str(self.path))
            if (bad := _first_outside(a.reshape(-1), self.num_nodes)) is not None:
                raise MomentError(f"node id {bad} out of range [0, {self.num_nodes})", source=str(self.path))
            return a.astype(np.int64)
        if "_id_map" not in self.__dict__:
            self.__dict__["_id_map"] = IdMap(np.asarray(self.node_ids), str(self.file(NODE_IDS)))
        return self.__dict__["_id_map"].nodes(ids, str(self.path), "nodes_of")

    def features_memmap(self) -> np.memmap:
        """The [num_nodes, feature_dim] feature matrix, memory-mapped read-only (no copy)."""
        return self._load("features")

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise MomentError(f"unknown split {name!r}; one of {', '.join(SPLITS)}")
        return self._load(f"{name}_idx")

    @property
    def train_idx(self) -> np.ndarray:
        return self.split("train")

    @property
    def val_idx(self) -> np.ndarray:
        return self.split("val")

    @property
    def test_idx(self) -> np.ndarray:
        return self.split("test")

    def degrees(self) -> np.ndarray:
        """Number of stored neighbours per node (row lengths), int64."""
        return np.diff(np.asarray(self.indptr))

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "path": str(self.path),
            "name": m.name,
            "num_nodes": m.num_nodes,
            "num_edges": m.num_edges,
            "avg_degree": m.num_edges / m.num_nodes,
            "feature_dim": m.feature_dim,
            "feature_dtype": m.feature_dtype,
            "num_classes": m.num_classes,
            "multilabel": self.multilabel,
            "train": m.files["train_idx"].shape[0],
            "val": m.files["val_idx"].shape[0],
            "test": m.files["test_idx"].shape[0],
            "bytes": sum(f.bytes for f in m.files.values()),
            "feature_bytes": m.files["features"].bytes,
            "source": m.source,
        }

    # -- checks

    def _err(self, name: str, message: str, hint: str | None = None) -> MomentError:
        return MomentError(message, source=str(self.path / self.manifest.files[name].file), hint=hint)

    def check_files(self) -> None:
        """Cheap checks: every file present with the promised size, dtype and shape; CSR endpoints."""
        m = self.manifest
        for name in ARRAYS:
            if name not in m.files:
                raise MomentError(f"manifest lists no file for {name!r}", source=str(self.path / MANIFEST))
        for rec in m.files.values():
            if not _SHA256.fullmatch(rec.sha256) or not rec.sha256.strip("0"):
                what = "zeroed" if rec.sha256 and not rec.sha256.strip("0") else "malformed"
                raise MomentError(f"the checksum of {rec.file} is {what} ({rec.sha256[:16]!r}): expected 64 hex "
                                  "digits, as written by `moment data synth/import`", source=str(self.path / MANIFEST))
            if rec.block_sha256 is not None and (
                    rec.block_bytes is None or len(rec.block_sha256) != -(-rec.bytes // rec.block_bytes)
                    or not all(_SHA256.fullmatch(b) for b in rec.block_sha256)):
                raise MomentError(f"the block checksums of {rec.file} do not cover its {rec.bytes} bytes",
                                  source=str(self.path / MANIFEST))
        for name, rec in m.files.items():
            f = self.path / rec.file
            if not f.is_file():
                raise MomentError("file listed in the manifest is missing", source=str(f))
            size = f.stat().st_size
            if size != rec.bytes:
                raise self._err(name, f"size {size} bytes disagrees with the manifest ({rec.bytes} bytes)")
        n, e, d = m.num_nodes, m.num_edges, m.feature_dim
        expect = {
            "indptr": ([n + 1], ("int64",)),
            "indices": ([e], INDEX_DTYPES),
            "features": ([n, d], FEATURE_DTYPES),
            "labels": ([n, m.num_classes], (MULTILABEL_DTYPE,)) if self.multilabel else ([n], LABEL_DTYPES),
        }
        for name, (shape, dtypes) in expect.items():
            a = self._load(name)
            if a.dtype.name not in dtypes:
                raise self._err(name, f"dtype {a.dtype.name}, expected one of {', '.join(dtypes)}")
            if list(a.shape) != shape:
                what = "row count" if name == "features" and len(a.shape) == 2 and a.shape[1] == d else "shape"
                raise self._err(name, f"wrong {what}: shape {list(a.shape)}, expected {shape}")
        own = self._load(NODE_IDS) if NODE_IDS in m.files else None
        if own is not None and (own.shape != (n,) or own.dtype.kind not in "iU"):
            raise self._err(NODE_IDS, f"expected the {n} nodes' own ids (integers or names), got {own.dtype.name} "
                            f"{list(own.shape)}")
        for s in SPLITS:
            a = self._load(f"{s}_idx")
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise self._err(f"{s}_idx", f"expected a 1-d integer array, got {a.dtype.name} {list(a.shape)}")
        for name, rec in m.files.items():
            a = self._load(name)
            if list(a.shape) != rec.shape or a.dtype.name != rec.dtype:
                raise self._err(name, f"header says {a.dtype.name} {list(a.shape)}, manifest {rec.dtype} {rec.shape}")
        ip = self.indptr
        if int(ip[0]) != 0:
            raise self._err("indptr", f"indptr must start at 0, starts at {int(ip[0])}")
        if int(ip[-1]) != e:
            raise self._err("indptr", f"indptr must end at num_edges={e}, ends at {int(ip[-1])}")
        for s in SPLITS:
            self._check_ids(f"{s}_idx", self._load(f"{s}_idx"))

    def _check_ids(self, name: str, a: np.ndarray) -> None:
        if (bad := _first_outside(a, self.num_nodes)) is not None:
            raise self._err(name, f"node id {bad} out of range [0, {self.num_nodes})")

    def validate(self) -> None:
        """Full structural validation, chunked so it streams through tens of millions of rows: indptr
        monotone, neighbour ids in [0, n), labels in range, split ids in range and labelled. What every
        consumer runs before sampling (once per opened dataset), so corrupt arrays are one error naming
        the file, never an IndexError in a sampler or a rank. 0.15-0.8 s for 8M nodes and 118M edges
        (bench/integrity.py)."""
        if self.__dict__.get("_validated"):
            return
        n = self.num_nodes
        ip = self.indptr
        step = CHUNK_BYTES // 8
        prev = 0
        for s in range(0, n + 1, step):
            c = np.asarray(ip[s : s + step])
            if not c.size:
                continue
            d = np.diff(c, prepend=prev)
            if bool((d < 0).any()):
                at = s + int(np.argmax(d < 0))
                raise self._err("indptr", f"indptr is not monotone: indptr[{at}] < indptr[{at - 1}]")
            prev = int(c[-1])
        if (bad := _first_outside(self.indices, n)) is not None:
            raise self._err("indices", f"neighbour id {bad} out of range [0, {n})")
        k = self.num_classes
        lab = self.labels
        for lo, hi in _chunk_minmax(lab):
            if self.multilabel and hi > 1:
                raise self._err("labels", f"multi-label labels must be 0 or 1, found {hi}")
            if lo < -1 or hi >= k:
                bad = lo if lo < -1 else hi
                raise self._err("labels", f"label {bad} out of range [-1, {k}) (num_classes={k}, -1 = unlabelled)")
        for s in SPLITS:
            idx = self._load(f"{s}_idx")
            self._check_ids(f"{s}_idx", idx)
            if idx.size and not self.multilabel and int(np.asarray(lab[np.asarray(idx)]).min()) < 0:
                raise self._err(f"{s}_idx", "split contains unlabelled nodes (label -1)")
        self.__dict__["_validated"] = True

    def spot_check(self) -> list[str]:
        """Re-hash a few blocks of every file (the first, the last and two between) against the manifest's
        block checksums; returns the files that have none (datasets written before them).

        Why: a run trusts the manifest's checksums without reading the files, so a copy whose files were
        replaced, regenerated or overwritten while its manifest was kept would pass as the original. This
        finds that for SPOT_CHECKED blocks a file (about 16 MiB of a 4 GiB feature file) instead of a
        full read; one changed byte elsewhere is found only by `verify` (every byte)."""
        unchecked = []
        for name, rec in self.manifest.files.items():
            if not _has_blocks(rec):
                unchecked.append(rec.file)
                continue
            k = len(rec.block_sha256)
            picks = sorted({int(round(x)) for x in np.linspace(0, k - 1, min(SPOT_CHECKED, k))}) if k else []
            b = bad_chunk(self.path / rec.file, rec.block_bytes, rec.block_sha256, picks)
            if b is not None:
                off = b * rec.block_bytes
                end = min(off + rec.block_bytes, rec.bytes)
                raise self._err(name, f"bytes {off}..{end} do not match the manifest's "
                                      "block checksum: the file changed after the dataset was written",
                                hint="re-create the dataset, or copy it again from the original")
        return unchecked

    def check(self, checked: str = "") -> list[str]:
        """What a run checks before it samples: the sampled blocks (`spot_check`) and the structure
        (`validate`); the full re-hash is `verify`'s. Returns notes for the user (none normally).

        `checked`: the `identity` of a dataset another process checked for this one (CHECKED_ENV): when this
        dataset is that one, unchanged, it is not checked again. Why: every rank of a run checked the dataset its
        launcher had just checked, each reading the whole graph (0.1-0.5 s a rank at 8-16M nodes, cold or on a
        loaded machine seconds; N ranks of a machine, N times)."""
        if checked and checked == self.identity():
            unchecked = [rec.file for rec in self.manifest.files.values() if not _has_blocks(rec)]
            self.__dict__["_validated"] = True
        else:
            unchecked = self.spot_check()
            self.validate()
        if not unchecked:
            return []
        return [f"dataset {self.path} has no block checksums (written by an older Moment): only the sizes of "
                f"{', '.join(unchecked)} were compared with its manifest; `moment data info --verify` reads "
                "every byte, or write the dataset again"]

    def verify_checksums(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Re-hash every file (streaming) against the manifest; `progress(done_bytes, total_bytes)`.
        The first mismatch raises, naming the file, in one line."""
        total = sum(rec.bytes for rec in self.manifest.files.values())
        done = 0
        for name, rec in self.manifest.files.items():
            h = hashlib.sha256()
            blocks = ChunkHasher(rec.block_bytes or CHUNK_BYTES)
            with open(self.path / rec.file, "rb") as f:
                while b := f.read(CHUNK_BYTES):
                    h.update(b)
                    blocks.update(b)
                    done += len(b)
                    if progress:
                        progress(done, total)
            got = h.hexdigest()
            if got != rec.sha256:
                raise self._err(name, f"sha256 mismatch: file {got[:16]}…, manifest {rec.sha256[:16]}… "
                                      "(the file changed after the dataset was written; re-create it)")
            if rec.block_sha256 is not None and blocks.finish() != rec.block_sha256:
                raise self._err(name, "the manifest's block checksums do not match the file (its sha256 does): "
                                      "the manifest was edited", hint="re-create the dataset")

    def vouch(self) -> tuple[list[str], str]:
        """`check`, and the `identity` its verdict holds for, which the processes this one starts are handed
        (CHECKED_ENV); "" when a file changed while it was checked."""
        before = self.identity()
        notes = self.check()
        return notes, before if before and before == self.identity() else ""

    def identity(self) -> str:
        """What a check's verdict is kept under (`check(checked)`): the manifest and every file it lists, each by
        its inode, size and time (a file written again, or replaced, is another), hashed; "" when one cannot be
        read, which no verdict matches."""
        files = (self.path / MANIFEST, *(self.path / rec.file for rec in self.manifest.files.values()))
        found = [file_identity(p) for p in files]
        if None in found:
            return ""
        return hashlib.sha256(json.dumps(found).encode()).hexdigest()

    @property
    def dataset_id(self) -> str:
        """The dataset's identity: sha256 over its files' checksums (name=sha256 lines, sorted). Two
        datasets have the same id exactly when every file has the same content."""
        lines = "".join(f"{k}={r.sha256}\n" for k, r in sorted(self.manifest.files.items()))
        return hashlib.sha256(lines.encode()).hexdigest()

    def verify(self) -> None:
        """Checksums plus full validation."""
        self.verify_checksums()
        self.validate()


def degree_histogram(indptr: np.ndarray, chunk: int = DEGREE_CHUNK) -> np.ndarray:
    """How many nodes have each in-degree, from a CSR's `indptr` (entry d: nodes of degree d; the last entry is
    the largest degree's). Read `chunk` nodes at a time, so that a memory-mapped graph of any size costs
    O(largest degree); numpy, so that a dry run's fan-out note needs no torch."""
    n = int(indptr.shape[0]) - 1
    hist = np.zeros(1, np.int64)
    for lo in range(0, n, chunk):
        got = np.bincount(np.diff(np.asarray(indptr[lo: min(lo + chunk, n) + 1])))
        if got.size > hist.size:
            got[: hist.size] += hist
            hist = got
        else:
            hist[: got.size] += got
    return hist[: int(np.flatnonzero(hist)[-1]) + 1] if hist.any() else hist


def _has_blocks(rec: FileRecord) -> bool:
    """Whether a manifest's file record has block checksums (datasets written before them have none)."""
    return rec.block_sha256 is not None and rec.block_bytes is not None


def open_dataset(path: str | Path, verify: bool = False) -> GraphDataset:
    """A dataset directory, opened and checked (`verify`: every checksum and the full validation too)."""
    return GraphDataset.open(path, verify=verify)


def _first_outside(a: np.ndarray, n: int, chunk_bytes: int = CHUNK_BYTES) -> int | None:
    """The first value of the integer array `a` outside [0, n) (None: none is), one unsigned maximum per chunk: a
    negative value is a huge unsigned one. Three times faster than each chunk's minimum and maximum, which
    launcher and ranks each pay at start: 0.09 s against 0.20-0.31 s for 236M neighbour ids."""
    u = np.dtype(a.dtype.str.replace("i", "u"))  # the same width and byte order, unsigned
    step = max(1, chunk_bytes // max(1, a.dtype.itemsize * int(np.prod(a.shape[1:]))))
    for s in range(0, a.shape[0], step):
        c = np.asarray(a[s : s + step])
        if c.size and int(c.view(u).max()) >= n:
            return int(c[(c < 0) | (c >= n)][0])
    return None


def _chunk_minmax(a: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> Iterable[tuple[int, int]]:
    step = max(1, chunk_bytes // max(1, a.dtype.itemsize))
    for s in range(0, a.shape[0], step):
        c = np.asarray(a[s : s + step])
        if c.size:
            yield int(c.min()), int(c.max())
