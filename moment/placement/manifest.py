"""The on-disk layout's manifest (versioned) and row format.

Row format: the runtime reads shard rows with O_DIRECT, so reads must be aligned to `align` bytes
(4096 by default; 512 for devices with 512-byte logical blocks). Two ways to get there:
- "pad": each row takes ceil(row_bytes / align) * align bytes, so every row starts at a multiple of
  `align` and is read as whole blocks;
- "pack" (only when row_bytes < align): each row takes the next power of two >= row_bytes; that
  divides `align`, so no row straddles an aligned block and one aligned block read fetches it.
"auto" picks the smaller stride (pad on a tie). `padding_overhead` = stride / row_bytes - 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moment.documents import mistaken, mistaken_dir
from moment.errors import MomentError, validation_error
from moment.inputs import check_dir, exists, read_text
from moment.outputs import SPLIT_MANIFEST, SPLIT_OWNERS, document_sha256
from moment.placement.bins import BinSet

if TYPE_CHECKING:
    from moment.workload.graph import GraphDataset

SCHEMA_VERSION = 1
FORMAT = "moment-layout"
MANIFEST = "manifest.json"
INDEX = "index.npy"
ORDER = "order.npy"
DEFAULT_CHUNK = 4 << 20

Progress = Callable[[int, int], None]
"""progress(done_bytes, total_bytes); raising from it aborts the operation."""

_Sealed = TypeVar("_Sealed", bound=BaseModel)


def manifest_sha256(doc: BaseModel | dict[str, Any]) -> str:
    """A manifest's own checksum (a layout's manifest.json, a split's cluster.json): sha256 of its canonical
    JSON (keys sorted, no spaces) with its `sha256` field left empty. `doc`: the model a writer writes (as its JSON
    reads back: a non-finite float is written as null), or the document as read (every key in it counts, so an edit
    to one this Moment does not know is seen too)."""
    return document_sha256(json.loads(doc.model_dump_json()) if isinstance(doc, BaseModel) else doc)


def sealed(m: _Sealed) -> _Sealed:
    """`m` with its own checksum filled in (`manifest_sha256`): what every writer of a manifest writes."""
    return m.model_copy(update={"sha256": manifest_sha256(m)})


class RowFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    row_bytes: int = Field(gt=0)
    align: int
    stride: int = Field(description="bytes between consecutive row starts in an SSD shard")
    mode: Literal["pad", "pack"]
    padding_overhead: float


def row_format(row_bytes: int, align: int = 4096, mode: Literal["auto", "pad", "pack"] = "auto") -> RowFormat:
    if align < 512 or align & (align - 1):
        raise MomentError(f"alignment must be a power of two >= 512 bytes, got {align}")
    if row_bytes <= 0:
        raise MomentError(f"row size must be positive, got {row_bytes}")
    pad = -(-row_bytes // align) * align
    pack = 1 << (row_bytes - 1).bit_length() if row_bytes < align else None
    if mode == "pack" and pack is None:
        raise MomentError(f"rows of {row_bytes} B are not smaller than the alignment {align} B: cannot pack")
    chosen = "pack" if mode == "pack" or (mode == "auto" and pack is not None and pack < pad) else "pad"
    stride = pack if chosen == "pack" else pad
    assert stride is not None
    return RowFormat(row_bytes=row_bytes, align=align, stride=stride, mode=chosen,
                     padding_overhead=stride / row_bytes - 1)


class FileSum(BaseModel):
    """A small file checksummed whole (index, node lists)."""

    path: str = Field(description="relative to the layout directory")
    bytes: int
    sha256: str


class Shard(BaseModel):
    """Rows of one bin; sha256 per fixed-size chunk so verification can name the bad offset. Its sizes are
    checked here, where the manifest is read: a chunk of 0 or -5 bytes made `layout verify` crash (pread's
    EINVAL) or blame chunk 0, and a run trained on it."""

    bin: str
    kind: str
    path: str = Field(description="relative to the layout directory, or absolute on an SSD mount")
    rows: int = Field(ge=0)
    stride: int = Field(gt=0)
    bytes: int = Field(ge=0)
    chunk_bytes: int = Field(gt=0)
    chunk_sha256: list[str]

    @model_validator(mode="after")
    def _chunks(self) -> Shard:
        want = -(-self.bytes // self.chunk_bytes)
        if len(self.chunk_sha256) != want:
            raise ValueError(f"{len(self.chunk_sha256)} chunk checksums for {self.bytes} B in chunks of "
                             f"{self.chunk_bytes} B (that is {want} chunks)")
        return self

    def chunk_span(self, k: int) -> str:
        """Chunk `k`'s bytes as a message names them (the last chunk ends with the file, not a chunk later)."""
        off = k * self.chunk_bytes
        return f"bytes {off}..{min(off + self.chunk_bytes, self.bytes)}"


class PlanRef(BaseModel):
    """Where the layout came from: the plan's machine and hardware placement."""

    machine: str | None = None
    placement: dict[str, str] = Field(default_factory=dict)
    policy: str = "ddak"
    pool: int | None = None


class DatasetRef(BaseModel):
    features_path: str
    sha256: str = Field(description="sha256 of the features file")
    id: str | None = Field(None, description="the dataset's identity (sha256 over all its files' checksums, "
                                              "GraphDataset.dataset_id); absent in layouts written before it")
    num_nodes: int = Field(ge=0)
    row_shape: list[int]
    dtype: str

    @property
    def row_bytes(self) -> int | None:
        """Bytes of one row as `row_shape` and `dtype` say (None: not a numeric dtype numpy knows, or a negative
        dimension)."""
        try:
            dt = np.dtype(self.dtype)
        except (TypeError, ValueError):
            return None
        if dt.kind not in "biufc" or any(d < 0 for d in self.row_shape):
            return None
        return math.prod(self.row_shape) * dt.itemsize


class RemoteBin(BaseModel):
    """Rows of a split layout that another machine owns (`moment place --machines`): they have index
    entries (bin len(shards) + i, a slot among that machine's rows here) but no file on this machine."""

    machine: int = Field(ge=0, description="the owning machine's index in the split")
    name: str = Field(description="the owning machine's name")
    rows: int = Field(ge=0)


class SplitRef(BaseModel):
    """What a machine's layout records of the split it belongs to (the cluster manifest says the rest)."""

    id: str = Field(description="the split's identity: the same in every machine's layout and the cluster manifest")
    machine: int = Field(ge=0, description="this machine's index in the split (its `moment train --node-rank`)")
    machines: list[str] = Field(min_length=1, description="every machine's name, by index")
    replicated_rows: int = Field(ge=0, description="the hottest rows, held by every machine")
    remote: list[RemoteBin] = Field(description="the rows other machines own, one bin per other machine")

    @model_validator(mode="after")
    def _check(self) -> SplitRef:
        n = len(self.machines)
        if self.machine >= n:
            raise ValueError(f"machine {self.machine} of a split of {n} machines")
        owners = sorted(r.machine for r in self.remote)
        if owners != [k for k in range(n) if k != self.machine]:
            raise ValueError(f"the remote bins name machines {owners}, not every other machine of the {n}")
        for r in self.remote:
            if r.name != self.machines[r.machine]:
                raise ValueError(f"remote bin of machine {r.machine} is named {r.name!r}, the split names it "
                                 f"{self.machines[r.machine]!r}")
        return self

    @property
    def name(self) -> str:
        return self.machines[self.machine]

    @property
    def remote_rows(self) -> int:
        return sum(r.rows for r in self.remote)


class LayoutManifest(BaseModel):
    format: Literal["moment-layout"] = FORMAT
    schema_version: int = SCHEMA_VERSION
    created_by: str
    plan: PlanRef
    dataset: DatasetRef
    row: RowFormat
    order: str = Field("hotness-rank", description="rows within a shard: hottest first, ties by node id")
    bins: BinSet
    shards: list[Shard] = Field(description="one per bin; GPU/CPU cache rows are unpadded, in the layout dir")
    index: FileSum = Field(description="int64 (num_nodes, 2): bin index, row slot in that bin's shard")
    cache_lists: dict[str, FileSum] = Field(description="GPU/CPU bin name -> node ids (.npy), slot order")
    order_file: FileSum | None = Field(None, description="node ids hottest first (pre-sampled hotness), .npy; "
                                                         "the runtime's static CPU cache takes a prefix")
    extra: dict[str, Any] = Field(default_factory=dict)
    split: SplitRef | None = Field(None, description="a machine's part of a split layout; None: every row is here")
    sha256: str = Field("", description="sha256 of this manifest without this field (`manifest_sha256`), so an "
                                        "edit (two shards' paths and checksums swapped) is refused; empty in "
                                        "layouts written before it")

    @model_validator(mode="after")
    def _rows_agree(self) -> LayoutManifest:
        """The dataset's row (shape x dtype) is the row the shards hold: a manifest edited to disagree passed
        `layout verify` and a run then died reshaping its first batch."""
        d, rb = self.dataset, self.row.row_bytes
        if d.row_bytes is None:
            raise ValueError(f"dataset: dtype {d.dtype!r} with row_shape {d.row_shape} is not a numeric row")
        if d.row_bytes != rb:
            raise ValueError(f"dataset: row_shape {d.row_shape} of {d.dtype} is {d.row_bytes} B, but row.row_bytes "
                             f"is {rb} B")
        if self.row.stride < rb:
            raise ValueError(f"row: stride {self.row.stride} B is less than row_bytes {rb} B")
        for s in self.shards:
            if s.stride < rb:
                raise ValueError(f"shards: bin {s.bin}'s stride {s.stride} B is less than row_bytes {rb} B")
        return self

    def layout_id(self) -> str:
        """The layout's identity: sha256 over the checksums of its index, cache lists and shards. A copied
        or moved layout keeps it; placing again (other bins, other rows per bin) changes it."""
        h = hashlib.sha256(f"index={self.index.sha256}\n".encode())
        for name, f in sorted(self.cache_lists.items()):
            h.update(f"list {name}={f.sha256}\n".encode())
        for s in sorted(self.shards, key=lambda s: s.bin):
            h.update(f"shard {s.bin}={','.join(s.chunk_sha256)}\n".encode())
        if self.split is not None:
            h.update(f"split {self.split.id} machine {self.split.machine}\n".encode())
        return h.hexdigest()


def layout_id(m: LayoutManifest) -> str:
    """The layout's identity: sha256 over its dataset and every file's checksums. What is made for a layout
    (its pack) records it, so a copy of another layout's pack is recognised as foreign; a layout copied
    whole keeps its id, a layout written again gets a new one (the index or the shards change)."""
    lines = [f"dataset={m.dataset.id or m.dataset.sha256}", f"row={m.row.row_bytes}/{m.row.stride}/{m.row.align}",
             f"index={m.index.sha256}", f"order={m.order_file.sha256 if m.order_file else ''}"]
    lines += [f"list {k}={f.sha256}" for k, f in sorted(m.cache_lists.items())]
    lines += [f"shard {s.bin}={s.rows}:" + hashlib.sha256("".join(s.chunk_sha256).encode()).hexdigest()
              for s in m.shards]
    if m.split is not None:
        lines.append(f"split={m.split.id}/{m.split.machine}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ---- loading a written layout's manifest, and checking it against a dataset (the reader, the pack and
# the runtime all start here) ---------------------------------------------------------------------------

#: the cluster manifest of a split layout (moment.placement.split owns the format)
CLUSTER_MANIFEST = SPLIT_MANIFEST


def _split_parts(p: Path) -> list[str] | None:
    """The machines' layouts in `p` when `p` looks like a split's top directory (its owners.npy, or
    subdirectories holding a machine's part of a split), else None. A directory that merely holds datasets or
    whole layouts (a project's data/) is not one: their manifests record no split."""
    try:
        parts = sorted(d.name for d in p.iterdir() if d.is_dir() and _is_split_part(d / MANIFEST))
    except OSError:
        return None
    return parts if parts or (p / SPLIT_OWNERS).is_file() else None


def _is_split_part(mf: Path) -> bool:
    """Whether `mf` is a layout manifest recording a split (read leniently: a damaged one is not counted)."""
    try:
        head = json.loads(mf.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT and head.get("split") is not None


class DamagedManifest(MomentError):
    """A layout manifest that is there but cannot be trusted (not JSON, fields that contradict the schema or
    each other): `layout verify` reports it as damage (exit 1), every other reader refuses the layout."""


def load_manifest(path: str | Path, *, own_checksum: bool = True) -> LayoutManifest:
    """The layout manifest at `path`, checked: its schema, and its own checksum (`manifest_sha256`) unless
    `own_checksum` is False (what a layout owns, to remove or replace it: an edited manifest still names its files,
    and removing or writing the layout again is the way out of its refusal)."""
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
        if (p / CLUSTER_MANIFEST).is_file():  # moment.placement.split's directory
            raise MomentError(f"this is a layout split over several machines ({CLUSTER_MANIFEST}), not one machine's "
                              "layout", source=str(p),
                              hint=f"train (or pack) with one machine's layout, --layout {p}/NAME (the machines are in "
                                   f"{CLUSTER_MANIFEST}); `moment layout verify/info/rm` take the split directory")
        if (parts := _split_parts(p)) is not None:  # a split's top directory whose cluster manifest is gone
            held = f" (machines' layouts {', '.join(parts)})" if parts else ""
            raise MomentError(f"no {CLUSTER_MANIFEST}: this is a split layout's top directory{held} without its "
                              "cluster manifest", source=str(p),
                              hint=f"each machine's layout ({p}/NAME) carries its part of the split and still "
                                   "trains, but the split cannot be checked or shown as a whole without it (which "
                                   "machine owns each row): write the split again with `moment place --machines N "
                                   "--out NEW` for one")
        raise mistaken_dir(p, "layout") or MomentError("no manifest.json: not a complete layout", source=str(p))
    try:
        head = json.loads(read_text(mf, "layout manifest"))
    except (ValueError, RecursionError) as e:
        raise DamagedManifest(f"manifest is not readable JSON: {e}", source=str(mf)) from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise mistaken(head, "layout", str(p)) or MomentError(
            "not a Moment layout manifest (no format 'moment-layout')", source=str(mf))
    if head.get("schema_version") != SCHEMA_VERSION:
        raise MomentError(f"layout schema version {head.get('schema_version')} is not supported "
                          f"(this Moment reads version {SCHEMA_VERSION})", source=str(mf))
    try:
        m = LayoutManifest.model_validate(head)
    except ValidationError as e:
        raise DamagedManifest(str(validation_error(e, "manifest does not match the schema")), source=str(mf),
                              hint="the layout is damaged: place it again") from None
    if own_checksum and m.sha256 and m.sha256 != manifest_sha256(head):
        raise DamagedManifest("the layout manifest was edited or damaged: its checksum does not match its content",
                              source=str(mf), hint="re-run `moment place` (with --overwrite) to write the layout again")
    return m


def unsealed_note(layout: str | Path, m: LayoutManifest) -> str | None:
    """What to say of a layout whose manifest has no checksum of its own (written before there was one): it is
    read as before, but an edit to it cannot be told from the layout as written."""
    if m.sha256:
        return None
    return (f"{Path(layout) / MANIFEST} has no checksum of its own (written by an older Moment): an edit to it "
            "cannot be detected; place the layout again to add one")


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
