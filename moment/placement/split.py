"""A graph split across machines: which machine owns which rows, and the directory that says so.

Why: when the features outgrow one server's SSDs, each machine holds a part. The hottest rows (those
every machine's GPU and CPU caches would hold anyway) are replicated on every machine, as DistDGL's
halo nodes and PaGraph's cache are; the rest is dealt out over the machines in hotness order, snake
fashion (0, 1, .., N-1, N-1, .., 0), so every machine owns about as many rows and as many of the
reads. Training seeds are not local to a machine (each rank samples the whole graph, as on one
server), so a machine reads about (N-1)/N of the non-replicated rows from their owners: the share
the cluster planner assumes (moment.planner.cluster).

`moment place --machines N` (or `--cluster FILE`) writes the split directory SPLIT:

    SPLIT/cluster.json    the cluster manifest (`ClusterManifest`): the machines, each one's layout and
                          layout id, the rows it holds and owns, the owners file's checksum; it carries
                          its own sha256, so a damaged one is named as such
    SPLIT/owners.npy      int16 per node: the machine that owns it, -1 for the replicated rows
    SPLIT/<machine>/      that machine's layout (a Moment layout; `moment train --layout SPLIT/<machine>`
                          on that machine): its rows in its bins, every other row in a remote bin of its
                          owner (moment.placement.manifest.SplitRef)

The whole directory is written under SPLIT.partial and put in place in one step (`publish_dir`), so a
crash leaves the old split or the new one. A machine's layout is self-contained for training (its
index says which machine owns each row it lacks), so it can be copied to its machine alone; `moment
layout rm SPLIT/<machine>` removes one machine's layout and `moment layout verify SPLIT` then names it
as missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

import moment
from moment.errors import MomentError, validation_error
from moment.inputs import check_dir, exists, read_text
from moment.locking import locked
from moment.outputs import (
    LEFTOVER_MARK,
    SPLIT_OWNERS,
    atomic_file,
    check_replaceable,
    fsync_dir,
    is_leftover,
    mark_leftover,
    put_back,
    remove_stale,
    sha256_file,
)
from moment.placement.layout import drop_shard_dirs, layout_files
from moment.placement.manifest import (MANIFEST, DatasetRef, FileSum, LayoutManifest, Progress, manifest_sha256,
                                       sealed)
from moment.placement.reader import CLUSTER_MANIFEST, VerifyReport, load_manifest, verify_layout

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

FORMAT = "moment-split"
SCHEMA_VERSION = 1
OWNERS = SPLIT_OWNERS
REPLICATED = -1  # owners.npy's value of a row every machine holds


class MachinePart(BaseModel):
    """One machine of the split, as the cluster manifest records it."""

    index: int = Field(ge=0)
    name: str
    layout: str = Field(description="its layout's directory, relative to the split directory")
    layout_id: str = Field(description="`LayoutManifest.layout_id()` of that layout as written")
    machine: str | None = Field(None, description="the profile its layout was placed for")
    inventory: str | None = None
    owned_rows: int = Field(ge=0, description="rows only this machine holds")
    held_rows: int = Field(ge=0, description="owned + replicated")
    bytes: int = Field(ge=0, description="its layout's shard bytes")
    remote_read_share: float = Field(description="share of this machine's feature reads that are of rows other "
                                                 "machines own, in a held-out sample "
                                                 "(moment.workload.hotness.heldout_reads)")


class ClusterManifest(BaseModel):
    format: Literal["moment-split"] = FORMAT
    schema_version: int = SCHEMA_VERSION
    created_by: str
    id: str = Field(description="the split's identity (dataset, owners and machine names): every machine's layout "
                                "records it, so layouts of two splits are never trained together")
    dataset: DatasetRef
    replicated_rows: int = Field(ge=0, description="the hottest rows, held by every machine")
    split: str = Field("hotness-snake", description="how the other rows were dealt out")
    machines: list[MachinePart] = Field(min_length=1)
    owners: FileSum = Field(description="int16 per node: the owning machine's index, -1 replicated")
    sha256: str = Field("", description="sha256 of this manifest without this field (see `manifest_sha256`)")


def split_id(dataset_id: str, owners_sha256: str, names: list[str]) -> str:
    """Same dataset, same owner of every row, same machines: the same split."""
    return hashlib.sha256(f"{dataset_id}|{owners_sha256}|{','.join(names)}".encode()).hexdigest()


def check_names(names: list[str]) -> None:
    """Machine names become directory names: the cluster file's one check (`check_machine_names`)."""
    from moment.topology.cluster import check_machine_names

    check_machine_names(names)


#: owners.npy holds int16 machine indices: no split has more machines than this
MAX_MACHINES = int(np.iinfo(np.int16).max)


def max_machines(num_nodes: int) -> int:
    """The most machines a graph of `num_nodes` rows can be split over: every machine must own at least
    one row (a machine owning none holds nothing of its own and only adds a rendezvous), and owners.npy
    indexes machines in int16. The one place this bound is stated."""
    return max(min(int(num_nodes), MAX_MACHINES), 0)


def check_machine_count(machines: int, num_nodes: int, source: str | None = None) -> None:
    """Refuse, before any work, a split over more machines than `max_machines(num_nodes)`."""
    most = max_machines(num_nodes)
    if machines > most:
        raise MomentError(f"--machines {machines}: this graph of {num_nodes:,} rows can be split over at most "
                          f"{most:,} machines (every machine must own rows)", source=source,
                          hint=f"pass --machines {min(most, machines)} or fewer")


def split_rows(order: np.ndarray, machines: int, replicated: int) -> np.ndarray:
    """Owner of each node: the `replicated` hottest (`order`: node ids hottest first) are held by every
    machine (REPLICATED); the others are dealt out in hotness order, snake fashion, so each machine owns
    as many rows (to one) and about as many reads as the next. Deterministic: ties follow `order`."""
    n = int(order.shape[0])
    if machines < 1:
        raise MomentError(f"a split needs at least one machine, got {machines}")
    owners = np.full(n, REPLICATED, np.int16)
    rest = order[min(max(int(replicated), 0), n):]
    p = np.arange(rest.shape[0], dtype=np.int64)
    lap, r = np.divmod(p, machines)
    owners[rest] = np.where(lap % 2 == 0, r, machines - 1 - r).astype(np.int16)
    return owners


def held_by(owners: np.ndarray, machine: int) -> np.ndarray:
    """Node ids machine `machine` holds (its own and the replicated), ascending."""
    return np.flatnonzero((owners == machine) | (owners == REPLICATED)).astype(np.int64)


def remote_read_share(owners: np.ndarray, reads: np.ndarray, machine: int) -> float:
    """Share of the reads (counts per node, from a sample the split was not chosen from:
    moment.workload.hotness.heldout_reads) that are of rows another machine owns."""
    total = float(np.sum(reads, dtype=np.float64))
    far = (owners != machine) & (owners != REPLICATED)
    return float(np.sum(reads[far], dtype=np.float64)) / total if total > 0 else 0.0


def write_owners(path: Path, owners: np.ndarray) -> FileSum:
    with atomic_file(path) as f:
        np.save(f, owners, allow_pickle=False)
    return FileSum(path=path.name, bytes=path.stat().st_size, sha256=sha256_file(path))


def write_cluster_manifest(directory: Path, m: ClusterManifest) -> None:
    m = m.model_copy(update={"created_by": m.created_by or f"moment {moment.__version__}"})
    with atomic_file(directory / CLUSTER_MANIFEST, text=True) as f:
        f.write(sealed(m).model_dump_json(indent=1))
    fsync_dir(directory)


def is_split(path: str | Path) -> bool:
    """Whether `path` is (or claims to be) a split directory: it has a cluster manifest and no layout manifest
    (`load_split` then says whether the cluster manifest is sound)."""
    p = Path(path)
    try:
        return (p / CLUSTER_MANIFEST).is_file() and not (p / MANIFEST).is_file()
    except OSError:  # a name too long, a loop: not a split (the caller's own checks say what it is)
        return False


def load_split(path: str | Path) -> ClusterManifest:
    """The cluster manifest of the split at `path`, its own checksum checked: a damaged one is one message."""
    p = Path(path)
    check_dir(p, "split layout directory")
    mf = p / CLUSTER_MANIFEST
    if not exists(mf):
        raise MomentError("no cluster.json: not a complete split layout", source=str(p))
    try:
        head = json.loads(read_text(mf, "cluster manifest"))
    except (ValueError, RecursionError) as e:
        raise MomentError(f"the cluster manifest is not readable JSON ({e}): it is damaged", source=str(mf),
                          hint="write the split again with `moment place --machines N --overwrite`") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise MomentError("not a Moment cluster manifest (no format 'moment-split')", source=str(mf))
    if head.get("schema_version") != SCHEMA_VERSION:
        raise MomentError(f"split schema version {head.get('schema_version')} is not supported (this Moment reads "
                          f"version {SCHEMA_VERSION})", source=str(mf))
    try:
        m = ClusterManifest.model_validate(head)
    except ValidationError as e:
        raise validation_error(e, "the cluster manifest does not match the schema", source=str(mf)) from None
    if m.sha256 != manifest_sha256(head):
        raise MomentError("the cluster manifest is damaged: its checksum does not match its content", source=str(mf),
                          hint="write the split again with `moment place --machines N --overwrite`")
    if [x.index for x in m.machines] != list(range(len(m.machines))):
        raise MomentError("the cluster manifest's machines are not numbered 0..N-1", source=str(mf))
    return m


def refuse_split_dir(path: str | Path, what: str = "--layout") -> None:
    """A split directory given where one machine's layout is expected: say which to give instead."""
    if is_split(path):
        try:
            names = [x.layout for x in load_split(path).machines]
        except MomentError:
            names = ["MACHINE"]
        p = Path(path)
        raise MomentError(f"this is a split layout of {len(names)} machines, not one machine's layout", source=str(p),
                          hint=f"give each machine its own: {what} {p / names[0]} on machine {names[0]}"
                               + (f", {what} {p / names[1]} on {names[1]}" if len(names) > 1 else "") + " ...")


def _owners_problem(owners: np.ndarray, m: ClusterManifest) -> str | None:
    n = m.dataset.num_nodes
    if owners.shape != (n,) or owners.dtype.kind not in "iu":
        return f"expected {n} integer owners, got {owners.dtype} {owners.shape}"
    k = len(m.machines)
    if n and (int(owners.min()) < REPLICATED or int(owners.max()) >= k):
        return f"an owner is outside -1..{k - 1}"
    counts = np.bincount(owners.astype(np.int64) + 1, minlength=k + 1)
    if int(counts[0]) != m.replicated_rows:
        return f"{int(counts[0])} replicated rows, the manifest says {m.replicated_rows}"
    for x in m.machines:
        if int(counts[x.index + 1]) != x.owned_rows:
            return f"machine {x.name} owns {int(counts[x.index + 1])} rows, the manifest says {x.owned_rows}"
    return None


def _machine_problem(layout: Path, lm: LayoutManifest, m: ClusterManifest, x: MachinePart,
                     owners: np.ndarray | None) -> str | None:
    """Whether machine `x`'s layout is the one the cluster manifest names, and agrees with the owners."""
    s = lm.split
    if s is None:
        return "it is not a machine's part of a split (its manifest records no split)"
    if s.id != m.id:
        return f"it belongs to another split (id {s.id[:12]}, the cluster manifest's is {m.id[:12]})"
    if s.machine != x.index or s.machines != [y.name for y in m.machines]:
        return f"it is machine {s.name} (index {s.machine}) of {s.machines}, not {x.name} (index {x.index})"
    if lm.layout_id() != x.layout_id:
        return f"its layout id {lm.layout_id()[:12]} is not the one the cluster manifest records ({x.layout_id[:12]})"
    if owners is None:
        return None
    idx = np.load(layout / lm.index.path, mmap_mode="r", allow_pickle=False)
    nlocal = len(lm.shards)
    bins = np.asarray(idx[:, 0])
    for j, r in enumerate(s.remote):
        mine = bins == nlocal + j
        if not np.array_equal(np.flatnonzero(mine), np.flatnonzero(owners == r.machine)):
            return f"its remote bin of machine {r.name} does not hold exactly the rows {r.name} owns"
    if int((bins < nlocal).sum()) != x.held_rows:
        return f"it holds {int((bins < nlocal).sum())} rows, the cluster manifest says {x.held_rows}"
    return None


def verify_split(path: str | Path, progress: Progress | None = None) -> VerifyReport:
    """Check the split at `path`: the cluster manifest (its checksum), the owners file (checksum and counts),
    and every machine's layout: present, the one the manifest names, agreeing with the owners, and sound
    (`verify_layout`). A damaged cluster manifest raises (nothing else can be checked without it)."""
    root = Path(path)
    m = load_split(root)
    rep = VerifyReport(path=str(root), ok=True)

    def bad(file: Path, msg: str, shard: str | None = None, offset: int | None = None) -> None:
        rep.ok = False
        rep.problems.append(f"{file}: {msg}")
        if rep.first_bad_file is None:
            rep.first_bad_file, rep.first_bad_shard, rep.first_bad_offset = str(file), shard, offset

    of = root / m.owners.path
    rep.files_checked += 1
    owners = None
    if not of.is_file():
        bad(of, "missing")
    elif of.stat().st_size != m.owners.bytes or sha256_file(of) != m.owners.sha256:
        bad(of, "checksum mismatch")
    else:
        owners = np.load(of, allow_pickle=False)
        if why := _owners_problem(owners, m):
            bad(of, f"the owners file is malformed: {why}")
            owners = None
    rep.bytes_checked += m.owners.bytes
    for x in m.machines:
        lp = root / x.layout
        if not (lp / MANIFEST).is_file():
            bad(lp, f"machine {x.name}'s layout is missing (removed, or not copied here)")
            continue
        try:
            lm = load_manifest(lp)
        except MomentError as e:  # its words alone: `bad` names the file, as for every other damaged file
            bad(lp / MANIFEST, str(e).split("\n")[0].removeprefix(f"{e.source}: " if e.source else ""))
            continue
        if why := _machine_problem(lp, lm, m, x, None):
            bad(lp, f"machine {x.name}'s layout: {why}")
            continue
        sub = verify_layout(lp, progress=progress)  # sound before its index is read for the owners' rows
        rep.files_checked += sub.files_checked
        rep.bytes_checked += sub.bytes_checked
        rep.notes += [n for n in sub.notes if n not in rep.notes]  # (the dataset's, once for all machines)
        if sub.problems:
            rep.ok = False
            rep.problems += sub.problems  # each names its file already
            if rep.first_bad_file is None:
                rep.first_bad_file, rep.first_bad_shard = sub.first_bad_file or str(lp), sub.first_bad_shard
                rep.first_bad_offset = sub.first_bad_offset
        elif owners is not None and (why := _machine_problem(lp, lm, m, x, owners)):
            bad(lp, f"machine {x.name}'s layout: {why}")
    return rep


# ---- what a split directory holds, and its removal ---------------------------------------------------


def split_paths(out: Path) -> tuple[Path, Path]:
    """SPLIT.partial (where a split is written) and SPLIT.old (the previous one while it is replaced)."""
    return out.with_name(out.name + ".partial"), out.with_name(out.name + ".old")


def recover(out: Path) -> None:
    """After a write of the split at `out` was killed (call holding its lock): a previous split left at
    SPLIT.old by a crash between two renames goes back to `out`; SPLIT.partial and any other SPLIT.old go."""

    partial, aside = split_paths(out.absolute())
    remove_stale(out)  # a SPLIT.partial killed while it was made (make_partial)
    ours = [d for d in (partial, aside) if is_leftover(d, out)]  # anything else of that name: refused
    if aside in ours and (aside / CLUSTER_MANIFEST).is_file():
        put_back(out, aside)
    for d in ours:
        if exists(d):
            drop_shard_dirs(d, None, out.absolute())  # its machines' shard directories on SSD mounts
            shutil.rmtree(d)


def owned_entries(root: Path, m: ClusterManifest, runs: list[Path] = ()) -> set[str]:
    """What a split directory Moment wrote holds (paths relative to it): the manifest, the owners file, what
    the manifest of each machine's layout still there names, and every file under `runs` (the training runs
    of those layouts that the caller checked hold only what runs wrote)."""
    named = {CLUSTER_MANIFEST, LEFTOVER_MARK, m.owners.path}
    for x in m.machines:
        lp = root / x.layout
        if (lp / MANIFEST).is_file():
            named |= {f"{x.layout}/{f}" for f in layout_files(lp, load_manifest(lp, own_checksum=False))}
    for r in runs:
        named |= {f.relative_to(root).as_posix() for f in Path(r).rglob("*") if not f.is_dir()}
    return named


def check_split_replaceable(out: Path, verb: str = "replace", runs: list[Path] = ()) -> ClusterManifest | None:
    """An existing split is replaced or removed only when Moment wrote it and it holds nothing its manifests do
    not name; a damaged cluster manifest is refused (what the split owns is unknown)."""
    if not is_split(out):
        if (out / MANIFEST).is_file():  # the other kind: `place --machines` over one machine's layout
            raise MomentError(f"is one machine's layout, not a split layout: refusing to {verb} it with a split",
                              source=str(out), hint=f"choose another --out, or remove it first with "
                                                    f"`moment layout rm {out}`")
        check_replaceable(out, "split layout", None, verb=verb)
        return None
    try:
        m = load_split(out)
    except MomentError as e:
        why = str(e).split("\n")[0].removeprefix(f"{e.source}: " if e.source else "")
        raise MomentError(f"{why}; what the split owns is unknown: refusing to {verb} it",
                          source=str(out / CLUSTER_MANIFEST),
                          hint=f"remove each machine's layout with `moment layout rm {out}/NAME`, then the directory"
                          ) from None
    check_replaceable(out, "split layout", owned_entries(out, m, runs), verb=verb)
    return m


def remove_split(path: str | Path, runs: list[Path] = ()) -> list[str]:
    """Remove the split at `path`: every machine's layout still there, `runs` (their training runs, which the
    caller checked), the owners file and the cluster manifest. Everything is checked first; the directory
    disappears in one rename. Returns the names of the machines whose layouts were removed."""
    out = Path(path).absolute()
    with locked(out, "layout"):
        recover(out)
        m = check_split_replaceable(out, "remove", [Path(r).absolute() for r in runs])
        assert m is not None
        partial, _ = split_paths(out)
        mark_leftover(out, out)  # what a kill leaves at SPLIT.partial is known as ours
        os.rename(out, partial)
        fsync_dir(out.parent)
        gone = [x.name for x in m.machines if (partial / x.layout / MANIFEST).is_file()]
        drop_shard_dirs(partial, gone, out)  # what the machines' layouts hold on SSD mounts (--ssd-path)
        shutil.rmtree(partial)
        fsync_dir(out.parent)
    return gone
