"""Check and read a written layout.

`verify_layout` recomputes every checksum (index, cache node lists, each shard chunk) and names the
first bad file and byte offset. `open_layout` gives a reader whose `rows(node_ids)` returns the
features bit-exactly as in the dataset (used by tests and tools; the training runtime reads the shards
itself with O_DIRECT using `locate`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ValidationError

from moment.documents import mistaken
from moment.errors import MomentError, validation_error
from moment.inputs import check_dir, exists, read_text
from moment.outputs import sha256_file
from moment.placement.manifest import FORMAT, MANIFEST, SCHEMA_VERSION, LayoutManifest, Progress, Shard

if TYPE_CHECKING:
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


def load_manifest(path: str | Path) -> LayoutManifest:
    p = Path(path)
    if not exists(p):
        hint = "an interrupted write leaves LAYOUT.partial; rerun the write" if p.name.endswith(".partial") else None
        if os.path.isfile(p.with_name(p.name + ".old") / MANIFEST):
            hint = (f"an interrupted overwrite left the previous layout at {p.name}.old; the next "
                    "`moment place --out` of this path puts it back")
        if hint:
            raise MomentError("layout directory not found", source=str(p), hint=hint)
    check_dir(p, "layout directory")
    mf = p / MANIFEST
    if not mf.is_file():
        raise MomentError("no manifest.json: not a complete layout", source=str(p))
    try:
        head = json.loads(read_text(mf, "layout manifest"))
    except (ValueError, RecursionError) as e:
        raise MomentError(f"manifest is not readable JSON: {e}", source=str(mf)) from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise mistaken(head, "layout", str(p)) or MomentError(
            "not a Moment layout manifest (no format 'moment-layout')", source=str(mf))
    if head.get("schema_version") != SCHEMA_VERSION:
        raise MomentError(f"layout schema version {head.get('schema_version')} is not supported "
                          f"(this Moment reads version {SCHEMA_VERSION})", source=str(mf))
    try:
        return LayoutManifest.model_validate(head)
    except ValidationError as e:
        raise validation_error(e, "manifest does not match the schema", source=str(mf)) from None


def check_dataset(layout: str | Path, m: LayoutManifest, dataset: GraphDataset) -> str | None:
    """Refuse to use `layout` with a dataset other than the one it was placed from.

    Layouts record the dataset's id (`GraphDataset.dataset_id`: all its files' checksums); a different
    id is refused. Layouts written before the id existed are checked by their features checksum only,
    and a note saying so is returned (None otherwise).
    """
    ref = m.dataset
    if ref.num_nodes != dataset.num_nodes:
        raise MomentError(f"the layout was placed from a dataset of {ref.num_nodes:,} nodes, {dataset.path} has "
                          f"{dataset.num_nodes:,}: they do not belong together", source=str(layout))
    if ref.id is not None:
        if ref.id != dataset.dataset_id:
            raise MomentError(f"the layout was placed from another dataset (id {ref.id[:12]}, features "
                              f"{ref.features_path}), not {dataset.path} (id {dataset.dataset_id[:12]}); "
                              "pass that dataset, or place this one", source=str(layout))
        return None
    if ref.sha256 != dataset.manifest.files["features"].sha256:
        raise MomentError(f"the layout was placed from other features (sha256 {ref.sha256[:12]}, "
                          f"{ref.features_path}) than {dataset.path}'s; pass that dataset, or place this one",
                          source=str(layout))
    return (f"layout {layout} records no dataset id (written by an older Moment): only the features checksum "
            "was compared with the dataset; place it again to record the id")


def shard_path(layout: Path, s: Shard) -> Path:
    p = Path(s.path)
    return p if p.is_absolute() else layout / p


def verify_layout(path: str | Path, progress: Progress | None = None) -> VerifyReport:
    """Check every checksum of the layout at `path`; never raises for damage, only reports it."""
    root = Path(path)
    m = load_manifest(root)
    rep = VerifyReport(path=str(root), ok=True)
    smalls = [m.index, *m.cache_lists.values(), *([m.order_file] if m.order_file else [])]
    total = sum(f.bytes for f in smalls) + sum(s.bytes for s in m.shards)

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
        with open(fp, "rb") as f:
            for k, want in enumerate(s.chunk_sha256):
                data = f.read(s.chunk_bytes)
                if hashlib.sha256(data).hexdigest() != want:
                    off = k * s.chunk_bytes
                    bad(fp, f"shard of bin {s.bin}: checksum mismatch in chunk {k} "
                            f"(bytes {off}..{off + s.chunk_bytes})", offset=off, shard=s.bin)
                    tick(s.bytes - off)
                    break
                tick(len(data))
    return rep


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
        strides = np.array([s.stride for s in self.manifest.shards], dtype=np.int64)
        return ent[:, 0], ent[:, 1] * strides[ent[:, 0]]

    def rows(self, node_ids) -> np.ndarray:
        """Features of `node_ids`, shape (len, *row_shape), bit-exact with the dataset."""
        ids = self._ids(node_ids)
        ent = np.asarray(self.index[ids])
        rb = self.manifest.row.row_bytes
        out = np.empty((ids.shape[0], rb), dtype=np.uint8)
        for b in np.unique(ent[:, 0]).tolist():
            sel = ent[:, 0] == b
            out[sel] = self._map(b)[ent[sel, 1], :rb]
        return out.view(self.dtype).reshape((ids.shape[0], *self.row_shape))

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
    return LayoutReader(root, m)
