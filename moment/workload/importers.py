"""Importers from published dataset layouts into Moment's on-disk format (`moment.workload.graph`).

Why: the systems this product compares with report on OGB and IGB; an import must reproduce their
graphs exactly, in bounded memory, and fail with a message that names the offending file.

Supported layouts (paths relative to the directory given on the command line):

* **OGB node property prediction** (`ogbn-*` after download/unzip; `moment.workload.import_ogb.import_ogb`,
  through the CSR build here), either
  - CSV: `raw/edge.csv.gz` ("src,dst" per line), `raw/node-feat.csv.gz` (one row of floats per node),
    `raw/node-label.csv.gz` (one label per node, "nan" = unlabelled), or
  - NPZ (ogbn-papers100M): `raw/data.npz` with `edge_index` [2, E], `node_feat` [N, D] and
    `raw/node-label.npz` with `node_label` [N] or [N, 1];
  and splits `split/<scheme>/{train,valid,test}.csv.gz` (one node id per line; the only scheme present
  is used, or name it with `split_name`). Edges are taken as stored: OGB datasets marked
  `add_inverse_edge` (e.g. ogbn-products, ogbn-proteins) need `undirected=True`.
* **IGB** (IGB260M / IGB-HOM numpy release), given the size directory (e.g. `igb/small`):
  `processed/paper/node_feat.npy` [N, D] float32, `processed/paper/node_label_19.npy` or
  `node_label_2K.npy` [N] (`classes=19|2K`), `processed/paper__cites__paper/edge_index.npy` [E, 2].
  Made undirected by default (as DiskGNN and the IGB loaders do). Splits follow the IGB loader:
  the first 60% of nodes train, the next 20% validation, the rest test (fractions configurable).
* **Edge list**: a text file with "src dst" (whitespace or comma separated, `#` comments) per line;
  optional features `.npy` [N, D] and labels `.npy` [N]. Without features, seeded N(0,1) features of
  `feature_dim` are generated; without labels, seeded random labels (DiskGNN does the same for
  Friendster), so such a dataset measures systems, not accuracy. A split of the user's own
  (`splits_dir`: train, valid|val, test files) is kept; without one, a seeded random split.
* **OGB `processed/`** (what `NodePropPredDataset` / `PygNodePropPredDataset` write), when `raw/` holds
  no edge list or `layout="processed"`: see `moment.workload.import_ogb_processed`.
* **PyG** `Data` / one-graph `InMemoryDataset` files: `moment.workload.import_pyg`; **loose `.npy`
  arrays**: `moment.workload.import_npy`. Both write through `write_parts` below.

Whatever the source, a split that comes with the data is kept as given (ids in range, no id twice, the
three disjoint, every id labelled), and the edges' duplicates and self-loops are counted, then kept or
dropped as `EdgePolicy` says; the counts land in the dataset's `source` (the import's report).

Edges u -> v land in row v (v aggregates from u). The CSR is built in two passes over chunks
(count rows, then scatter into a scratch file) and a third pass sorts each row, counting (and dropping,
by the policy) repeated neighbours and self-loops.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError
from moment.inputs import check_dir
from moment.workload.graph import (CHUNK_BYTES, MAX_CLASSES, NODE_IDS, SPLITS, GraphDataset, GraphWriter, index_dtype,
                                   label_dtype)
from moment.workload.import_files import (comment_lines_blanked, first_line, is_number, load_npy, need, node_ids,
                                          open_text, read_csv_chunks, read_node_ids, split_files, unreadable)
from moment.workload.import_options import (MIN_TRAIN, RANDOM_SPLIT, EdgePolicy, check_feature_dim, check_node_count,
                                            random_split_shares)
from moment.workload.node_tables import read_label_table, read_node_table
from moment.workload.parquet import Table, id_pairs, is_parquet, pick_pair
from moment.workload.renumber import IdMap, NameCodes, as_number, first_respelt, read_ids
from moment.workload.seeds import check_seed

# Imports inside functions: pandas loads only for the formats that need it.

Progress = Callable[[int, int], None]
EDGE_CHUNK = 1 << 22  # edges per chunk in every pass
NAME_CHUNK = 1 << 20  # edges per chunk of an edge list read as names (a Python string each)
#: from this many classes on, labels that use fewer than half of the class numbers are said to be sparse (codes
#: such as 0, 1000, 2000 made thousands of outputs of which a handful are ever a target)
SPARSE_CLASSES = 10


# --------------------------------------------------------------------------------------------- helpers


#: bytes of memory per node while the CSR is built (counts, indptr, cursor / out_ptr, labels: int64 each)
CSR_BYTES_PER_NODE = 32


#: what a user can do about a huge largest id, by default (an edge list's import can number its ids itself)
SPARSE_IDS_HINT = "node ids must be numbered 0..N-1: renumber them, or check --num-nodes"


def check_build_size(n: int, generated_row_bytes: int, out_dir: Path, source: str, why: str = "",
                     hint: str = SPARSE_IDS_HINT) -> None:
    """Before allocating anything: do `n` nodes fit in the memory available (and the generated features
    on the disk)? Ids are array indices, so one stray huge id means a huge graph."""
    from moment.sizes import available_memory, fmt_size

    need = n * CSR_BYTES_PER_NODE
    avail = available_memory()
    if avail is not None and need > avail:
        raise MomentError(f"{why}the graph has {n:,} nodes: building it needs about {fmt_size(need)} "
                          f"of memory, but {fmt_size(avail)} is available", source=source, hint=hint)
    if generated_row_bytes:
        import shutil

        anchor = Path(out_dir).absolute().parent
        while not anchor.exists():
            anchor = anchor.parent
        disk = n * generated_row_bytes
        free = shutil.disk_usage(anchor).free
        if disk > free:
            raise MomentError(f"{why}the graph has {n:,} nodes: their generated features need "
                              f"{fmt_size(disk)} on disk, but {fmt_size(free)} is free in {anchor}",
                              source=source, hint=hint)


def _labels_to_int(raw: np.ndarray, source: str) -> np.ndarray:
    """Labels as stored: one class a node ([N] or [N, 1], int64, -1 = unlabelled), or multi-label [N, C]."""
    a = np.asarray(raw)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim == 2:
        return multilabel(a, source)
    if a.ndim != 1:
        raise MomentError(f"labels must be a vector [N], [N, 1] or a multi-label matrix [N, C], got shape "
                          f"{list(a.shape)}", source=source)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if np.any(a[~bad] != np.floor(a[~bad])):
            raise MomentError("labels must be whole numbers", source=source)
        out = np.where(bad, -1, np.clip(a, -1, MAX_CLASSES)).astype(np.int64)  # (1e20 cast wrapped negative)
    elif a.dtype.kind == "u":  # uint32's or uint64's largest value, no class, is -1 cast to it: no label, as -1
        none = a == np.iinfo(a.dtype).max if np.iinfo(a.dtype).max >= MAX_CLASSES else np.zeros(a.shape, bool)
        out = np.where(none, -1, np.minimum(a.astype(np.uint64), MAX_CLASSES).astype(np.int64))
    elif a.dtype.kind in "ib":  # a bool vector is a binary target: classes 0 (False) and 1 (True)
        out = a.astype(np.int64)
    else:
        raise MomentError(f"labels must be numeric, got {a.dtype}", source=source)
    if out.size and out.max() >= MAX_CLASSES:
        top = a[i := int(np.argmax(out))]
        raise MomentError(f"node {i} has label {top}: classes are numbered 0..C-1 with C at most {MAX_CLASSES:,}",
                          source=source, hint=f"if {top} marks a node without a label, make it -1")
    return np.where(out < 0, -1, out)


def multilabel(a: np.ndarray, source: str) -> np.ndarray:
    """[N, C] targets, a 0/1 a class (bool, integers or whole floats: PyG's PPI, ogbn-proteins), as uint8;
    anything else (a regression target, NaN) refused naming the first such value."""
    if a.dtype.kind not in "biuf":
        raise MomentError(f"labels must be numeric, got {a.dtype}", source=source)
    bad = ~((a == 0) | (a == 1))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise MomentError(f"labels of shape {list(a.shape)} are read as multi-label (a 0/1 target for each of "
                          f"{a.shape[1]} classes), but node {i}'s target {j} is {a[i, j].item()!r}", source=source,
                          hint="Moment trains classification: one class a node ([N]) or 0/1 targets ([N, C])")
    return a.astype(np.uint8)


def _random_splits(labels: np.ndarray, fractions: tuple[float, float, float], seed: int,
                   source: str) -> tuple[list[np.ndarray], dict[str, Any]]:
    """A seeded random train/val/test split of the labelled nodes, and what the import's note says of it (the
    shares, the sizes, the labelled nodes drawn from)."""
    from moment.workload.synth import split_sizes

    labelled = np.arange(labels.shape[0]) if labels.ndim == 2 else np.flatnonzero(labels >= 0)
    try:  # the fewest training nodes are the default shares' alone: shares given are followed as given
        tr, va, te = split_sizes(labelled.size, *fractions, min_train=MIN_TRAIN if fractions == RANDOM_SPLIT else 0)
    except MomentError as e:
        k, n = labelled.size, labels.shape[0]
        which = f"{n} node{'s' if n != 1 else ''}" if k == n else f"{k} labelled node{'s' if k != 1 else ''} of {n:,}"
        raise MomentError(f"{which}: too few for a random train, val and test split ({e.message})", source=source,
                          hint="label more nodes, or give the split (an import's --help says how)") from None
    pick = labelled[np.random.default_rng([seed, 3]).choice(labelled.size, size=tr + va + te, replace=False)]
    said = {"shares": list(fractions), "sizes": [tr, va, te], "labelled": int(labelled.size)}
    return [np.sort(pick[:tr]), np.sort(pick[tr : tr + va]), np.sort(pick[tr + va :])], said


def _edge_chunks(edges: np.ndarray, layout: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) int64 chunks of an [E, 2] ("rows") or [2, E] ("cols") array, memmap or not; uint64 ones as
    they are, so that an id beyond 2^63 - 1 is named as it is (cast, 2^63 was -9223372036854775808): `build_csr`
    casts them once they are checked in range."""
    e = edges.shape[0] if layout == "rows" else edges.shape[1]
    to = np.uint64 if edges.dtype == np.uint64 else np.int64
    for s in range(0, e, EDGE_CHUNK):
        if layout == "rows":
            c = np.asarray(edges[s : s + EDGE_CHUNK])
            yield c[:, 0].astype(to), c[:, 1].astype(to)
        else:
            yield np.asarray(edges[0, s : s + EDGE_CHUNK]).astype(to), np.asarray(
                edges[1, s : s + EDGE_CHUNK]
            ).astype(to)


@dataclass
class EdgeReport:
    """What `build_csr` found among the edges and what it did with them (the import's report).

    `self_loops_found` counts input edges u -> u. `duplicate_edges_found` counts adjacency entries that repeat
    one already in their row, after `undirected` added reverse edges: an input listing both u -> v and
    v -> u shows one duplicate per such pair when made undirected."""

    input_edges: int = 0
    self_loops_found: int = 0
    self_loops_dropped: int = 0
    duplicate_edges_found: int = 0
    duplicate_edges_dropped: int = 0
    edges: int = 0

    def as_source(self, policy: EdgePolicy) -> dict[str, Any]:
        return {"input_edges": self.input_edges, "self_loops": policy.self_loops,
                "self_loops_found": self.self_loops_found, "self_loops_dropped": self.self_loops_dropped,
                "duplicates": policy.duplicates, "duplicate_edges_found": self.duplicate_edges_found,
                "duplicate_edges_dropped": self.duplicate_edges_dropped}


def build_csr(
    w: GraphWriter,
    edges: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
    num_nodes: int,
    *,
    source: str,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    progress: Progress | None = None,
    nodes_from: str = "",
) -> EdgeReport:
    """Writes `indptr` and `indices` from (src, dst) chunks (called twice); returns what it found and did.

    Memory: three int64 arrays of num_nodes plus one chunk; the scatter goes to a scratch memmap. A self-loop
    gets no reverse edge (it is its own).
    """
    n = num_nodes
    rep = EdgeReport()
    counts = np.zeros(n, dtype=np.int64)
    total = 0
    for src, dst in edges():
        for name, a in (("source", src), ("destination", dst)):
            if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
                bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
                raise MomentError(f"{name} node id {bad} out of range [0, {n})"
                                  + (f": {n} nodes, {nodes_from}" if nodes_from else ""), source=source)
        src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
        counts += np.bincount(dst, minlength=n)
        total += dst.size
        rep.input_edges += dst.size
        loop = src == dst
        rep.self_loops_found += int(loop.sum())
        if undirected:
            counts += np.bincount(src[~loop], minlength=n)
            total += int(dst.size - loop.sum())
    indptr = np.concatenate([[0], np.cumsum(counts)])
    scratch_path = w.tmp / "scratch-indices.bin"
    scratch = np.lib.format.open_memmap(scratch_path, mode="w+", dtype=np.int64, shape=(max(total, 1),))
    cursor = indptr[:-1].copy()
    done = 0
    for src, dst in edges():
        src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
        if undirected:
            fwd = src != dst
            rows, vals = np.concatenate([dst, src[fwd]]), np.concatenate([src, dst[fwd]])
        else:
            rows, vals = dst, src
        order = np.argsort(rows, kind="stable")
        rows, vals = rows[order], vals[order]
        first = np.searchsorted(rows, rows, side="left")
        scratch[cursor[rows] + (np.arange(rows.size) - first)] = vals
        u, c = np.unique(rows, return_counts=True)
        cursor[u] += c
        done += rows.size
        if progress is not None:
            progress(done, 2 * total)
    del cursor
    # third pass: sort each row (counting and, by the policy, dropping repeats and self-loops), in row
    # chunks of ~EDGE_CHUNK edges
    drop_loops, dedupe = policy.self_loops == "drop", policy.duplicates == "drop"
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    ix = w.stream("indices", index_dtype(n), ())
    written = 0
    bounds = np.searchsorted(indptr, np.arange(0, total + EDGE_CHUNK, EDGE_CHUNK), side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(bounds, 0, n), [n]]))
    for a, b in itertools.pairwise(bounds):
        a, b = int(a), int(b)
        seg = np.asarray(scratch[indptr[a] : indptr[b]])
        rows = np.repeat(np.arange(a, b, dtype=np.int64), counts[a:b])
        if drop_loops:
            keep = seg != rows
            rep.self_loops_dropped += int(keep.size - keep.sum())
            seg, rows = seg[keep], rows[keep]
        if n < 2**31:
            key = (rows - a) * n + seg
            key.sort()
            repeat = key[1:] == key[:-1]
            rep.duplicate_edges_found += int(repeat.sum())
            if dedupe and key.size:
                key = key[np.concatenate([[True], ~repeat])]
            rows = key // n
            seg = key - rows * n
            rows += a
        else:  # pragma: no cover - ids beyond 2**31 need a two-key sort
            o = np.lexsort((seg, rows))
            rows, seg = rows[o], seg[o]
            repeat = (rows[1:] == rows[:-1]) & (seg[1:] == seg[:-1])
            rep.duplicate_edges_found += int(repeat.sum())
            if dedupe and seg.size:
                keep = np.concatenate([[True], ~repeat])
                rows, seg = rows[keep], seg[keep]
        out_ptr[a + 1 : b + 1] = written + np.cumsum(np.bincount(rows - a, minlength=b - a))
        ix.write(seg)
        written += seg.size
        if progress is not None:
            progress(total + int(indptr[b]), 2 * total)
    del scratch
    scratch_path.unlink()
    w.finish("indices")
    w.write_array("indptr", out_ptr)
    if dedupe:
        rep.duplicate_edges_dropped = rep.duplicate_edges_found
    rep.edges = written
    return rep


def check_feature_shape(feat: np.ndarray, source: str) -> np.ndarray:
    """Features are a matrix of one row a node and at least one value a row (an empty row cannot be stored)."""
    if feat.ndim != 2 or feat.shape[1] < 1:
        raise MomentError(f"features must be a matrix [N, D] with D >= 1, got shape {list(feat.shape)}",
                          source=source)
    return feat


def _write_features(w: GraphWriter, chunks: Iterator[np.ndarray], n: int, source: str) -> None:
    """Streams feature rows into `features.npy`: float16/float32 kept, other numbers become float32."""
    fw = None
    for c in chunks:
        c = check_feature_shape(np.asarray(c), source)
        if c.dtype.kind not in "fiub":
            raise MomentError(f"features have dtype {c.dtype}: expected numbers (float16 and float32 are kept, "
                              "other numbers become float32)", source=source)
        if fw is None:
            dt = c.dtype if c.dtype.name in ("float32", "float16") else np.float32
            fw = w.stream("features", dt, (c.shape[1],), rows=n)
        if c.shape[1] != fw.row_shape[0]:
            raise MomentError(f"rows have {c.shape[1]} values, earlier rows {fw.row_shape[0]}", source=source)
        if fw.written + c.shape[0] > n:
            raise MomentError(f"more feature rows than the graph's {n} nodes", source=source)
        was = c
        with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes infinity: said below
            c = c.astype(fw.dtype, copy=False)
        if not np.isfinite(c).all():
            k = int(np.argwhere(~np.isfinite(c))[0][0])
            if np.isfinite(was[k]).all():
                v = float(was[k][np.argmax(np.abs(was[k]))])
                raise MomentError(f"features beyond {fw.dtype}'s range: row {fw.written + k} holds {v:g} (at most "
                                  f"{np.finfo(fw.dtype).max:.3g})", source=source)
            raise MomentError(f"features contain NaN or infinity (row {fw.written + k})", source=source)
        fw.write(c)
    if fw is None or fw.written != n:
        got = 0 if fw is None else fw.written
        raise MomentError(f"wrong row count: {got} feature rows for {n} nodes", source=source)
    w.finish("features")


def _matrix_chunks(a: np.ndarray) -> Iterator[np.ndarray]:
    step = max(1, CHUNK_BYTES // max(1, a.shape[1] * a.dtype.itemsize)) if a.ndim == 2 else 1 << 20
    for s in range(0, a.shape[0], step):
        yield np.asarray(a[s : s + step])


def _check_splits(splits: list[np.ndarray], labels: np.ndarray, names: list[str],
                  own: np.ndarray | None = None) -> list[np.ndarray]:
    """The user's split as given, or one error naming the file: ids in range, none listed twice, the three
    disjoint (a node in train and test would be evaluated on what it was trained on), all labelled. `own`: the
    graph's own ids, by which a node is named (the split files name it so, not by its node number)."""
    n = labels.shape[0]

    def shown(node: int) -> str:
        return str(node if own is None else own[node])

    owner = np.zeros(n, dtype=np.int8)  # 1 + the split holding each node, 0 = none
    out = []
    for i, (idx, src) in enumerate(zip(splits, names)):
        idx = np.asarray(idx).astype(np.int64).reshape(-1)
        if i == 0 and not idx.size:  # (else the next command said so: presample, place, train)
            raise MomentError("the train split is empty: no node to train on", source=src,
                              hint="give the split files of this graph's ids, or none to draw a random split")
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise MomentError(f"node id {bad} out of range [0, {n})", source=src)
        s = np.sort(idx)
        twice = s[1:][s[1:] == s[:-1]]
        if twice.size:
            mask = idx.size == n and s[-1] <= 1  # 0s and 1s, one a node: a mask saved as integers (torch's uint8)
            raise MomentError(f"node id {shown(int(twice[0]))} is listed more than once in the {SPLITS[i]} split "
                              f"({twice.size} repeats)" + (f": {n} entries of 0 and 1 look like a mask" if mask else ""),
                              source=src, hint="save a mask as booleans (mask.astype(bool)): an integer array is "
                              "node ids" if mask else None)
        held = owner[idx]
        if held.any():
            j = int(np.flatnonzero(held)[0])
            o = int(held[j]) - 1
            raise MomentError(f"node id {shown(int(idx[j]))} is in both the {SPLITS[o]} split ({names[o]}) and the "
                              f"{SPLITS[i]} split ({int((held > 0).sum())} such nodes): the splits must be disjoint",
                              source=src)
        owner[idx] = i + 1
        if idx.size and (none := labels[idx] < 0).any():
            raise MomentError(f"split contains unlabelled nodes ({int(none.sum()):,}, node id "
                              f"{shown(int(idx[np.argmax(none)]))} the first)", source=src)
        out.append(idx)
    return out


def _finish(
    w: GraphWriter, labels: np.ndarray, splits: list[np.ndarray], num_classes: int | None, source: dict, names: list[str],
    edges: EdgeReport, policy: EdgePolicy, own: np.ndarray | None = None,
) -> GraphDataset:
    multi = labels.ndim == 2
    if multi:
        k = labels.shape[1]
    else:
        k = int(num_classes) if num_classes else (int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 1)
    if not multi and labels.size and labels.max() >= k:
        raise MomentError(f"label {int(labels.max())} >= number of classes {k}", source=names[0])
    splits = _check_splits(splits, labels, names[1:], own)
    w.write_array("labels", labels, label_dtype(k, multi))
    for name, idx in zip(SPLITS, splits):
        w.write_array(f"{name}_idx", idx)
    unlabelled = 0 if multi else int(np.count_nonzero(labels < 0))  # a negative label or NaN (`_labels_to_int`)
    used = k if multi else int(np.count_nonzero(np.bincount(labels[labels >= 0], minlength=k)))
    return w.commit(num_classes=k, source=source | edges.as_source(policy) |
                    ({"unlabelled_nodes": unlabelled} if unlabelled else {}) |
                    ({"sparse_labels": {"distinct": used, "classes": k}} if k >= SPARSE_CLASSES and used < k / 2
                     else {}))


def import_notices(source: dict[str, Any]) -> list[str]:
    """What a person should know about an imported dataset (from its manifest's `source`): parts that were
    generated rather than imported, and edges the import dropped."""
    out = []
    if source.get("generated_features"):
        out.append("the input has no node features: seeded N(0,1) features were generated, so the dataset "
                   "measures the system, not accuracy")
    if source.get("generated_labels"):
        out.append("the input has no labels: seeded random labels were generated")
    if (t := source.get("ids_as_written")) is not None:
        n = as_number(t)
        out.append(f"the ids are kept as written: {t!r} is the integer {n} written another way, so {t!r} and {n!r} "
                   "would be two nodes, and node_ids are text")
    if sparse := source.get("sparse_labels"):
        out.append(f"{sparse['distinct']:,} distinct labels spread over class numbers 0..{sparse['classes'] - 1:,}: "
                   f"the model gets {sparse['classes']:,} outputs, one for every number between; if the labels are "
                   "codes, number them 0..N-1 first (or give them as names)")
    if source.get("split") == "random":
        drawn = source.get("random_split")
        if drawn:  # (datasets imported before the sizes were recorded say less)
            tr, va, te = drawn["sizes"]
            shares = ",".join(f"{x:g}" for x in drawn["shares"])
            out.append(f"no split came with the input: a seeded random one was drawn from the {drawn['labelled']:,} "
                       f"labelled nodes, train {tr:,} / val {va:,} / test {te:,} (shares {shares}, at least "
                       f"{MIN_TRAIN} train; --random-split 0.6,0.2,0.2 draws others)")
        else:
            out.append("no split came with the input: a seeded random train/val/test split was drawn")
    if n := source.get("unlabelled_nodes"):
        why = ("the label table leaves it out or marks it so" if source.get("labels_from")
               else "a negative label or NaN in the input")
        out.append(f"{n:,} node{'s have' if n > 1 else ' has'} no label ({why}): "
                   f"{'they are' if n > 1 else 'it is'} in no split")
    for key, what, flag in (("duplicate_edges_dropped", "duplicate edges", "--duplicates keep"),
                            ("self_loops_dropped", "self-loops", "--self-loops keep")):
        if source.get(key):
            out.append(f"{source[key]:,} {what} dropped ({flag} keeps them)")
    return out


# --------------------------------------------------------------------------------------------- arrays


@dataclass
class GraphParts:
    """An imported graph's arrays before they are written. Each may be memory-mapped (read in chunks, never
    whole). None = not in the input: features and labels are then generated (seeded) and the split drawn at
    random, and the dataset's `source` says so (`import_notices`)."""

    edges: np.ndarray  # integer [2, E] (PyG's edge_index) or [E, 2]
    edges_source: str
    num_nodes: int | None = None
    num_nodes_source: str = ""
    nodes_from: str = ""  # what set the node count (write_parts: for a message naming it)
    features: np.ndarray | None = None
    features_source: str = ""
    labels: np.ndarray | None = None
    labels_source: str = ""
    #: train, val, test: node ids or boolean masks (arrays), or files `read_node_ids` reads
    splits: list[np.ndarray | Path] | None = None
    split_sources: list[str] | None = None
    own_ids: np.ndarray | None = None  # the graph's own ids in node order: how a split's messages name a node


def edge_layout(edges: np.ndarray, source: str) -> str:
    """"cols" for [2, E] (PyG's edge_index; also a [2, 2] array), "rows" for [E, 2]; integer ids only."""
    if edges.dtype.kind not in "iu":
        raise MomentError(f"edges have dtype {edges.dtype}: expected integer node ids", source=source)
    if edges.ndim == 2 and edges.shape[0] == 2:
        return "cols"
    if edges.ndim == 2 and edges.shape[1] == 2:
        return "rows"
    raise MomentError(f"edges must have shape [2, E] or [E, 2], got {list(edges.shape)}", source=source)


#: a node count taken from the largest edge id, where the edges name fewer than this share of the nodes on a graph
#: of at least SPARSE_NODES, is refused: the ids are the graph's own (user ids), not node numbers, and the import
#: would make millions of nodes without an edge (4 edges up to id 1,999,999: 2M nodes, 1 GB of drawn features)
SPARSE_SHARE, SPARSE_NODES = 0.1, 100_000


def check_sparse_ids(chunks: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]], n: int, source: str,
                     hint: str) -> None:
    """Refuse a node count read from the largest edge id when the edges name few of its nodes (a mark a node:
    n bytes, after `check_build_size` bounded n)."""
    if n < SPARSE_NODES:
        return
    seen = np.zeros(n, dtype=bool)
    for src, dst in chunks():
        for a in (src, dst):
            seen[a[(a >= 0) & (a < n)]] = True
    named = int(np.count_nonzero(seen))
    if named < SPARSE_SHARE * n:
        raise MomentError(f"the edges name {named:,} distinct nodes, but their largest id is {n - 1:,}: read as node "
                          f"numbers, the graph would have {n:,} nodes, {n - named:,} of them without an edge",
                          source=source, hint=hint)


def _largest_id(edges: np.ndarray, layout: str) -> int:
    hi = -1
    for src, dst in _edge_chunks(edges, layout):
        if src.size:
            hi = max(hi, int(src.max()), int(dst.max()))
    return hi


def write_parts(
    parts: GraphParts,
    out_dir: str | Path,
    *,
    source: dict[str, Any],
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    feature_dim: int = 128,
    num_classes: int = 2,
    seed: int = 0,
    fractions: tuple[float, ...] | str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Checks `parts` against each other (shapes, dtypes, node count) and writes them as a dataset.

    The node count is `num_nodes`, else the features' or labels' rows, else the largest edge id + 1; every
    array that has one row a node must agree with it, or the error names that array's source. `fractions`: the
    random split's shares (`random_split_shares`), for an input without a split."""
    check_seed(seed)
    check_feature_dim(feature_dim)
    fractions = random_split_shares(fractions, parts.splits is not None)
    layout = edge_layout(parts.edges, parts.edges_source)
    feat = parts.features
    if feat is not None:
        check_feature_shape(feat, parts.features_source)
    check_node_count(parts.num_nodes, parts.num_nodes_source)
    lab = None if parts.labels is None else _labels_to_int(parts.labels, parts.labels_source)
    given = [(k, what, src) for k, what, src in (
        (parts.num_nodes, "num_nodes", parts.num_nodes_source),
        (None if feat is None else feat.shape[0], "feature rows", parts.features_source),
        (None if lab is None else lab.shape[0], "labels", parts.labels_source)) if k is not None]
    n = int(given[0][0]) if given else _largest_id(parts.edges, layout) + 1
    if given:
        parts.nodes_from = f"the {given[0][1]} of {given[0][2]}"
    for k, what, src in given:
        if k != n:
            raise MomentError(f"wrong row count: {k} {what} for {n} nodes ({given[0][1]} of {given[0][2]})",
                              source=src)
    if n <= 0:
        raise MomentError("no edges and no node count", source=parts.edges_source)
    check_build_size(n, feature_dim * 4 if feat is None else 0, Path(out_dir), parts.edges_source)
    if not given:
        check_sparse_ids(lambda: _edge_chunks(parts.edges, layout), n, parts.edges_source,
                         hint="if these are the graph's own ids, number them 0..N-1 first (`moment data import "
                              "edgelist --renumber` does, keeping them); to keep them as node numbers, give the node "
                              "count")
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        return _fill(w, parts, n, layout, lab, source=source, undirected=undirected, policy=policy,
                     feature_dim=feature_dim, num_classes=num_classes, seed=seed, fractions=fractions,
                     progress=progress)


def _fill(
    w: GraphWriter, parts: GraphParts, n: int, layout: str, labels: np.ndarray | None, *, source: dict[str, Any],
    undirected: bool, policy: EdgePolicy, progress: Progress | None, **rest: Any,
) -> GraphDataset:
    """Writes checked parts into an open writer, generating what the input lacks (seeded)."""
    rep = build_csr(w, lambda: _edge_chunks(parts.edges, layout), n, source=parts.edges_source,
                    undirected=undirected, policy=policy, progress=progress, nodes_from=parts.nodes_from)
    return _rest(w, parts, n, labels, rep, source=source, policy=policy, **rest)


def _rest(
    w: GraphWriter, parts: GraphParts, n: int, labels: np.ndarray | None, rep: EdgeReport, *, source: dict[str, Any],
    policy: EdgePolicy, feature_dim: int, num_classes: int, seed: int, fractions: tuple[float, float, float],
) -> GraphDataset:
    """After the CSR: features, labels and split, each the input's or generated (seeded, said in `source`)."""
    generated = parts.features is None and "features" not in w.records
    if "features" in w.records:
        pass  # written as the input was read (an edge list's node table)
    elif parts.features is None:
        _write_features(w, _random_features(n, feature_dim, seed), n, "generated")
    else:
        _write_features(w, _matrix_chunks(parts.features), n, parts.features_source)
    if labels is None:
        labels, k = np.random.default_rng([seed, 4]).integers(0, num_classes, size=n), num_classes
    else:
        k = labels.shape[1] if labels.ndim == 2 else max(int(labels.max()) + 1, 1)
    if parts.splits is None:
        if labels.ndim == 1 and labels.size and labels.max() < 0:
            raise MomentError("no node has a label (every one is negative or NaN: unlabelled), so there is nothing "
                              "to split or train on", source=parts.labels_source or parts.edges_source)
        splits, drawn = _random_splits(labels, fractions, seed, parts.labels_source or parts.edges_source)
        names = [parts.edges_source] * 3
        source = source | {"random_split": drawn}
    else:
        names = list(parts.split_sources or [str(x) for x in parts.splits])
        splits = [read_node_ids(x, n, f"{part} split") if isinstance(x, Path) else node_ids(x, n, src, f"{part} split")
                  for x, part, src in zip(parts.splits, SPLITS, names)]
    made = {"generated_features": generated, "generated_labels": parts.labels is None,
            "split": "random" if parts.splits is None else "given"}
    source = source | {k: v for k, v in made.items() if k not in source}  # (OGB's split: its scheme's name)
    return _finish(w, labels, splits, k, source, [parts.labels_source or parts.edges_source, *names], rep, policy,
                   parts.own_ids)


def spool_csv_edges(w: GraphWriter, paths: list[Path]) -> np.ndarray:
    """Parses edge CSVs once into a scratch [E, 2] int64 .npy (the files one after the other), so that the CSR
    passes re-read it fast."""

    def chunks() -> Iterator[np.ndarray]:
        for path in paths:
            for c in read_csv_chunks(path, EDGE_CHUNK, "int64"):
                if c.ndim != 2 or c.shape[1] != 2:
                    raise MomentError(f"expected two columns (src,dst), got {c.shape[1] if c.ndim == 2 else 1}",
                                      source=str(path))
                yield c

    return _spool(w, chunks())


def read_csv_labels(path: Path) -> np.ndarray:
    """A labels CSV (one row a node; several columns: multi-label targets) as `_labels_to_int` stores them."""
    return _labels_to_int(np.concatenate(list(read_csv_chunks(path, 1 << 22, "float64"))), str(path))


def write_csv_graph(w: GraphWriter, edge_files: list[Path], feat_csv: Path, n: int, *, undirected: bool,
                    policy: EdgePolicy, progress: Progress | None, nodes_from: str = "") -> EdgeReport:
    """The CSR of `edge_files`' edges (spooled once, then built) and the features of `feat_csv`, into `w`."""
    spool = spool_csv_edges(w, edge_files)
    rep = build_csr(w, lambda: _edge_chunks(spool, "rows"), n, source=str(edge_files[0]), undirected=undirected,
                    policy=policy, progress=progress, nodes_from=nodes_from)
    spool = None  # the memmap goes before its file
    (w.tmp / "scratch-edges.npy").unlink()
    _write_features(w, _short_rows_named(read_csv_chunks(feat_csv, 1 << 16, "float32"), feat_csv), n, str(feat_csv))
    return rep


def _short_rows_named(chunks: Iterator[np.ndarray], path: Path) -> Iterator[np.ndarray]:
    """A features CSV's chunks, a row with fewer fields than the first (which the parser pads with NaN, then
    called "NaN or infinity") or an empty field one error saying so; the file is read again only then."""
    done = 0
    for c in chunks:
        if c.ndim == 2 and (gap := np.isnan(c)).any():
            k = int(np.argmax(gap.any(axis=1)))
            fields = _data_line(path, done + k)
            if fields is not None and len(fields) < c.shape[1]:
                raise MomentError(f"row {done + k} has {len(fields)} field{'s' if len(fields) != 1 else ''}, the first "
                                  f"row {c.shape[1]}", source=str(path))
            if fields is not None and "" in fields:
                raise MomentError(f"row {done + k} has an empty field (feature {fields.index('')})", source=str(path))
        done += len(c)
        yield c


def _data_line(path: Path, row: int) -> list[str] | None:
    """The fields of a CSV's `row`-th line of data (0: the first; blank and # lines are none), as the parser
    counts them; None past the end."""
    with open_text(path) as f:
        lines = (ln.split("#", 1)[0] for ln in f)
        for k, ln in enumerate(x for x in lines if x.strip()):
            if k == row:
                return [t.strip() for t in ln.strip().split(",")]
    return None


# --------------------------------------------------------------------------------------------- OGB


#: the files ogb's loaders write under processed/, in the order they are looked for (the first is
#: memory-mapped, the second read whole; moment.workload.import_ogb_processed reads them)
PROCESSED_FILES = ("geometric_data_processed.pt", "data_processed")


def ogb_split_files(split_dir: Path) -> list[Path]:
    """split/<scheme>/{train,valid,test}.csv.gz, as ogb's `get_idx_split` reads them."""
    return [need(split_dir / f"{part}.csv.gz", f"{part} split") for part in ("train", "valid", "test")]


def ogb_split_dir(root: Path, split_name: str | None) -> Path:
    """split/<split_name>, or the only scheme under split/."""
    base = root / "split"
    if split_name:
        return base / split_name
    options = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(options) == 1:
        return options[0]
    if not options:
        raise MomentError("no split/<scheme>/ directory with train/valid/test.csv.gz", source=str(base))
    raise MomentError(f"several split schemes ({', '.join(p.name for p in options)}); choose one with --split",
                      source=str(base))


# --------------------------------------------------------------------------------------------- IGB


IGB_LABELS = {"19": "node_label_19.npy", "2K": "node_label_2K.npy", "2k": "node_label_2K.npy"}


def import_igb(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    classes: str = "19",
    undirected: bool = True,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    policy: EdgePolicy = EdgePolicy(),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports one IGB size directory (the one holding `processed/`); see the module docstring."""
    root = check_dir(src_dir, "IGB dataset directory")
    if classes not in IGB_LABELS:
        raise MomentError(f"classes must be 19 or 2K, got {classes!r}")
    paper = root / "processed" / "paper"
    feat = load_npy(paper / "node_feat.npy", "node features")
    lab_path = paper / IGB_LABELS[classes]
    labels = _labels_to_int(np.asarray(load_npy(lab_path, f"labels ({IGB_LABELS[classes]})")), str(lab_path))
    ei_path = root / "processed" / "paper__cites__paper" / "edge_index.npy"
    ei = load_npy(ei_path, "edge index")
    check_feature_shape(feat, str(paper / "node_feat.npy"))
    n = feat.shape[0]
    if labels.shape[0] != n:
        raise MomentError(f"{labels.shape[0]} labels for {n} nodes (node_feat.npy)", source=str(lab_path))
    if ei.ndim != 2 or 2 not in ei.shape:
        raise MomentError(f"expected [E, 2], got shape {list(ei.shape)}", source=str(ei_path))
    layout = "rows" if ei.shape[1] == 2 else "cols"
    tr, va, _ = fractions
    a, b = int(n * tr), int(n * tr) + int(n * va)
    ids = np.arange(n, dtype=np.int64)
    splits = [ids[:a], ids[a:b], ids[b:]]
    splits = [s[labels[s] >= 0] for s in splits]
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        rep = build_csr(w, lambda: _edge_chunks(ei, layout), n, source=str(ei_path), undirected=undirected,
                        policy=policy, progress=progress)
        _write_features(w, _matrix_chunks(feat), n, str(paper / "node_feat.npy"))
        num_classes = 19 if classes == "19" else 2983
        src = {"importer": "igb", "from": str(root.resolve()), "classes": classes, "undirected": undirected}
        return _finish(w, labels, splits, max(num_classes, int(labels.max()) + 1), src,
                       [str(lab_path), str(root), str(root), str(root)], rep, policy)


# --------------------------------------------------------------------------------------------- edge list


def import_edgelist(
    edges_file: str | Path,
    out_dir: str | Path,
    *,
    features: str | Path | None = None,
    labels: str | Path | None = None,
    splits_dir: str | Path | None = None,
    num_nodes: int | None = None,
    renumber: bool = False,
    node_ids: str | Path | None = None,
    node_table: str | Path | None = None,
    label_table: str | Path | None = None,
    unlabelled: tuple[str, ...] = (),
    header: bool | None = None,
    feature_dim: int = 128,
    num_classes: int = 2,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    fractions: tuple[float, ...] | str | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports a "src dst" text edge list, with optional features/labels `.npy` files and the user's split
    (`splits_dir`, see `split_files`); without a split, a seeded random one.

    `renumber`: the ids are the graph's own (sparse integers or names), numbered 0..N-1 in sorted order;
    `node_ids`: a file of them in node order (nodes no edge names included). Either way the features' and
    labels' rows follow that order, the split files name the graph's own ids, and the dataset keeps them
    (`GraphDataset.node_ids`). `node_table`: the nodes in order with their features, `label_table` their labels,
    both keyed by the graph's own ids (`moment.workload.node_tables`). `fractions`: the random split's shares
    (`random_split_shares`), without `splits_dir`. `header`: whether the text edge list's first line is a
    header (None: as `edge_text` and `_names_text` tell)."""
    check_seed(seed)
    check_feature_dim(feature_dim)
    check_node_count(num_nodes)
    fractions = random_split_shares(fractions, splits_dir is not None)
    for one, other, names in ((node_table, features or node_ids, "--node-table and --features/--node-ids"),
                              (label_table, labels, "--label-table and --labels")):
        if one is not None and other is not None:
            raise MomentError(f"give one of {names}: both say the same", source=names.split()[0])
    if unlabelled and label_table is None:
        raise MomentError("names labels that mean no label, which only a --label-table has", source="--unlabelled")
    path = need(Path(edges_file), "edge list file")
    for given, what in ((features, "features file"), (labels, "labels file")):
        if given:
            need(Path(given), what)  # before the edges are read
    split_paths = split_files(splits_dir) if splits_dir is not None else None
    ids = (IdMap(read_ids(Path(node_ids), "node ids file", defines=True), str(node_ids)) if node_ids is not None
           else None)
    node_header = None  # a node table's first line, read as its columns' names
    text = edge_text(path, header)
    respelt = None  # an id written as an integer other than plainly (`007`): the ids were read as names
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        if node_table is not None:
            ids, node_header = read_node_table(node_table, w)  # the nodes and their features
        if renumber or ids is not None:
            spool, ids, text, respelt = _spool_renumbered(w, path, text, ids, header)
            hi = len(ids) - 1
        else:
            spool, hi = _spool_edges(w, path, text)
        feat = load_npy(Path(features), "features file") if features else None
        lab = None
        if labels:
            lp = Path(labels)
            lab = _labels_to_int(np.asarray(load_npy(lp, "labels file")), str(lp))
        sizes = [x for x in (num_nodes, None if feat is None else feat.shape[0], None if lab is None else lab.shape[0])
                 if x is not None]
        n = len(ids) if ids is not None else sizes[0] if sizes else hi + 1
        of = f" ({ids.counted})" if ids is not None else ""
        if feat is not None:
            check_feature_shape(feat, str(features))
        if ids is not None and num_nodes is not None and num_nodes != n:
            raise MomentError(f"gives {num_nodes:,} nodes, but the ids number {n:,}{of}", source="--num-nodes")
        for what, src, k in (("features", features, None if feat is None else feat.shape[0]),
                             ("labels", labels, None if lab is None else lab.shape[0])):
            if k is not None and k != n:
                raise MomentError(f"wrong row count: {k} {what} rows for {n} nodes{of}", source=str(src))
        if label_table is not None:
            table = read_label_table(label_table, ids or IdMap(np.arange(n), f"the node numbers 0..{n - 1}"), n,
                                     unlabelled)
            lab = table.labels
        if hi >= n:
            raise MomentError(f"node id {hi} out of range [0, {n})", source=str(path),
                              hint="--num-nodes (or the features/labels rows) must exceed the largest id")
        if n <= 0:
            raise MomentError("no edges and no node count", source=str(path))
        check_build_size(n, feature_dim * 4 if feat is None else 0, w.out_dir, str(path),
                         why=f"the largest node id is {hi:,}, so " if n == hi + 1 and not num_nodes and ids is None
                         else "", hint="if these are the graph's own ids (sparse), --renumber numbers them 0..N-1 "
                         "and keeps them in the dataset; or check --num-nodes")
        if n == hi + 1 and not sizes and ids is None:
            check_sparse_ids(lambda: _edge_chunks(spool, "rows"), n, str(path),
                             hint="if these are the graph's own ids, import with --renumber (they are kept as its "
                                  "node ids); to keep them as node numbers, give --num-nodes")
        rep = build_csr(w, lambda: _edge_chunks(spool, "rows"), n, source=str(path), undirected=undirected,
                        policy=policy, progress=progress)
        spool = None
        (w.tmp / "scratch-edges.npy").unlink()
        splits: list[np.ndarray | Path] | None = split_paths
        if ids is not None and split_paths is not None:
            splits = [_own_split(ids, f, part, n) for f, part in zip(split_paths, SPLITS)]
        parts = GraphParts(np.zeros((0, 2), np.int64), str(path), features=feat, features_source=str(features),
                           labels=lab, labels_source=str(labels or label_table or ""), splits=splits,
                           split_sources=None if split_paths is None else [str(f) for f in split_paths],
                           own_ids=None if ids is None else ids.original)
        src = {"importer": "edgelist", "from": str(path.resolve()), "undirected": undirected,
               **({"columns": list(text.columns)} if text.columns else
                  {"header": ",".join(text.header), "columns_swapped": text.swapped} if text.header else {})}
        if ids is not None:
            w.write_array(NODE_IDS, ids.original)
            src |= {"node_ids": ids.counted, **({"ids_as_written": respelt} if respelt else {})}
        if node_header is not None:
            src |= {"node_table_header": node_header}
        if label_table is not None:
            src |= {"labels_from": str(label_table), **({"class_names": table.class_names} if table.class_names else {}),
                    **({"labels_left_out": table.unlabelled} if table.unlabelled else {}),
                    **({"label_table_header": table.header} if table.header else {})}
        return _rest(w, parts, n, lab, rep, source=src, policy=policy, feature_dim=feature_dim,
                     num_classes=num_classes, seed=seed, fractions=fractions)


def _spool_edges(w: GraphWriter, path: Path, text: EdgeText) -> tuple[np.ndarray, int]:
    """The edge list's integer ids, parsed once into the scratch [E, 2] int64 .npy; and the largest."""
    hi = -1

    def checked() -> Iterator[np.ndarray]:
        nonlocal hi
        for c in _read_edge_text(path, text):
            if c.size and int(c.min()) < 0:
                raise MomentError(f"negative node id {int(c.min())}", source=str(path))
            hi = max(hi, int(c.max()) if c.size else -1)
            yield c

    return _spool(w, checked()), hi


def _spool_renumbered(w: GraphWriter, path: Path, text: EdgeText, ids: IdMap | None,
                      header: bool | None) -> tuple[np.ndarray, IdMap, EdgeText, str | None]:
    """The edge list's own ids numbered (by `ids`, else in sorted order) into the scratch [E, 2] int64 .npy;
    how its text was read; and the first id written as an integer other than plainly, when that made the ids
    names (None: it did not).

    Integer ids (any int64, however sparse) are spooled once and numbered in place when each is written as an
    integer's plain digits; ids with a name among them, or one such as `007` (`renumber.plain_integer`: the
    integer parser would make it node 7, and `007` and `7` one node), are read again, as text, into codes
    (`NameCodes`) renumbered in place. Whether a first line of names is a header: `_names_text`."""
    what = f"the edge list ({path.name})"
    spool, respelt = None, None
    if ids is None or ids.kind == "integer":
        try:
            spool = _spool(w, _read_edge_text(path, text), mode="r+")
        except MomentError:  # a name among the ids: read them as text
            pass
        else:
            if spool.shape[0] == 0 and text.header and header is None:
                spool = None  # a line of names alone: no number says it is a header, as names it may be an edge
            elif ids is None and not text.columns:
                respelt = first_respelt(path, text.sep, text.use or (0, 1), every=text.use is None)
                spool = None if respelt is not None else spool
    if spool is not None:
        starts = range(0, spool.shape[0], EDGE_CHUNK)
        ids = ids if ids is not None else IdMap.of_sorted_unique((spool[s : s + EDGE_CHUNK] for s in starts),
                                                                 str(path), "integer ids")
        number = lambda c: ids.nodes(c, str(path), what)  # noqa: E731
    else:
        text, check = _names_text(text, ids, header, respelt is not None)
        names = NameCodes(ids)
        spool = _spool(w, (names.codes(c, str(path), what)
                           for c in _read_edge_text(path, text, dtype=str, chunk=NAME_CHUNK)), mode="r+")
        if check is not None:
            _first_line_is_an_edge(spool, check, path)
        ids, rank = names.finish(str(path))
        number = (lambda c: rank[c]) if rank is not None else None  # noqa: E731
    if number is not None:
        for s in range(0, spool.shape[0], EDGE_CHUNK):
            spool[s : s + EDGE_CHUNK] = number(spool[s : s + EDGE_CHUNK])
    spool.flush()
    return _scratch(w), ids, text, respelt


def _names_text(text: EdgeText, ids: IdMap | None, header: bool | None,
                numbers: bool) -> tuple[EdgeText, EdgeText | None]:
    """How to read an edge list whose ids are names, and the header to check after (`_first_line_is_an_edge`).

    A first line without a number is a header when it names the columns (src,dst ...; or the source and
    destination among more), when every other id is a number (`numbers`: they were ids such as `007`), or when
    neither of its names is among the given `ids` (names); otherwise it is read as an edge, and the caller checks that
    one of its names occurs on another line: two names no other line has are a header just as well as an edge
    of its own (`user_a,user_b`, as pandas writes columns of other names), which only the user can tell.
    `header` says it (True, False): then the line is what it says."""
    if header is not None or not text.header or text.columns or _names_columns(text) or numbers:
        return text, None
    if ids is not None:  # (integer ids: a name on another line too, which is refused, naming the first)
        return (text if ids.kind == "text" and not np.isin(np.array(text.header, dtype=str), ids.original).any()
                else EdgeText(text.sep, fields=text.fields)), None
    return EdgeText(text.sep, fields=text.fields), text


def _first_line_is_an_edge(spool: np.ndarray, head: EdgeText, path: Path) -> None:
    """Refuse a first line whose names no other line has (the codes in `spool` number the names as they came,
    so the first line's are the smallest): a header or an edge, read as neither without the user's word."""
    if spool.shape[0] == 0:
        return
    top = int(spool[0].max())
    for s in range(1, spool.shape[0], EDGE_CHUNK):
        if (spool[s : s + EDGE_CHUNK] <= top).any():
            return
    line = ",".join(head.header or [])
    raise MomentError(f"line {head.skip} ({line if line.isprintable() else repr(line)}) names nodes that no other "
                      "line names: it may be a header or an edge of its own", source=str(path),
                      hint="--header skips it (or name its columns src,dst), --no-header reads it as an edge")


def _spool(w: GraphWriter, chunks: Iterable[np.ndarray], mode: str = "r") -> np.ndarray:
    """[K, 2] int64 chunks into the scratch [E, 2] .npy the CSR passes re-read fast; mapped (`mode`)."""
    sw = w.stream("scratch-edges", np.int64, (2,))
    try:
        for c in chunks:
            sw.write(c)
    except BaseException:
        sw.abort()
        w._open.pop("scratch-edges")
        raise
    sw.close()
    w._open.pop("scratch-edges")
    return _scratch(w, mode)


def _scratch(w: GraphWriter, mode: str = "r") -> np.ndarray:
    return np.load(w.tmp / "scratch-edges.npy", mmap_mode=mode)


def _names_columns(text: EdgeText) -> bool:
    """Whether a header line names the two columns (src,dst; target source ...), as opposed to naming nodes."""
    h = [t.strip().lower() for t in text.header or []]
    return text.use is not None or (len(h) == 2 and all(t in SRC_NAMES | DST_NAMES for t in h))


def _own_split(ids: IdMap, path: Path, part: str, n: int) -> np.ndarray:
    """A split file of the graph's own ids (or a boolean mask in node order) as node numbers."""
    a = read_ids(path, f"{part} split", names=ids.kind == "text")
    return node_ids(a, n, str(path), f"{part} split") if a.dtype == np.bool_ else ids.nodes(a, str(path), f"{part} split")


#: the first bytes of binary files people give `import edgelist`, and the importer each should go to
BINARY_MAGIC = ((np.lib.format.MAGIC_PREFIX, "a NumPy .npy file", "moment data import npy --edge-index {path}"),
                (b"PK\x03\x04", "a zip archive (a torch.save file, or an .npz)",
                 "moment data import pyg {path} (for a torch.save of a PyG Data)"),
                (b"\x80", "a Python pickle (an old torch.save file)", "moment data import pyg {path}"),
                (b"\x1f\x8b", "gzip-compressed (a compressed edge list is read when its name ends in .gz)",
                 "mv {path} {path}.gz"))


def _refuse_binary(path: Path) -> None:
    """A binary file is not an edge list: name what it is and its importer instead of a codec error."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return  # the text reader says why
    for magic, what, cmd in BINARY_MAGIC:
        if head.startswith(magic):
            raise MomentError(f"this is {what}, not a text edge list", source=str(path), hint=f"use `{cmd.format(path=path)}`")


#: the names a header line of an edge list may give its columns (`df.to_csv(index=False)` writes one): a
#: header naming the destination first swaps the columns, so that "dst,src" is not read as "src dst"
SRC_NAMES = {"src", "source", "from", "u", "src_id", "source_id", "sender", "head"}
DST_NAMES = {"dst", "target", "to", "v", "dst_id", "target_id", "destination", "receiver", "tail"}


@dataclass(frozen=True)
class EdgeText:
    """How an edge list's text is laid out: its separator and, when its first line holds no number, that
    line as the header (the number of lines up to it, comments included, is `skip`). A Parquet edge list has
    `columns` instead: its source and destination columns, in that order."""

    sep: str
    header: list[str] | None = None
    skip: int = 0
    columns: tuple[str, str] | None = None
    fields: int = 2  # on the first line
    use: tuple[int, int] | None = None  # among more fields, the header's source and destination (`src,dst,weight`)

    @property
    def swapped(self) -> bool:
        if self.use:
            return self.use[0] > self.use[1]
        h = [t.strip().lower() for t in self.header or []]
        return len(h) == 2 and h[0] in DST_NAMES and h[1] in SRC_NAMES


def edge_text(path: Path, header: bool | None = None) -> EdgeText:
    """The separator (a comma if the first line has one, else white space) and header of an edge list; or a
    Parquet edge list's two columns. `header`: whether the first line is one (None: when it holds no number)."""
    if is_parquet(path):
        cols = pick_pair(Table(path, "edge list"), SRC_NAMES, DST_NAMES, "edge list")
        return EdgeText("", columns=cols)
    if path.suffix != ".gz":
        _refuse_binary(path)
    sep, tokens, skip = first_line(path)
    if not tokens or header is False or (header is None and any(map(is_number, tokens))):
        return EdgeText(sep, fields=len(tokens) or 2)
    named = [[i for i, t in enumerate(tokens) if t.lower() in names] for names in (SRC_NAMES, DST_NAMES)]
    use = (named[0][0], named[1][0]) if len(tokens) > 2 and all(len(n) == 1 for n in named) else None
    return EdgeText(sep, tokens, skip, fields=len(tokens), use=use)


def _read_edge_text(path: Path, text: EdgeText, dtype: Any = "int64", chunk: int = EDGE_CHUNK) -> Iterator[np.ndarray]:
    """[K, 2] chunks of the edge list's ids: int64, or with `dtype=str` the tokens as text (no token is NaN)."""
    if text.columns:
        yield from id_pairs(Table(path, "edge list"), text.columns, dtype is str, chunk, "edge")
        return

    def wrong_columns(got: int) -> MomentError:
        head = ",".join(text.header or [])
        what = f" (the header: {head if head.isprintable() else repr(head)})" if text.header else ""
        return MomentError(f"expected 2 columns (src dst), got {got}{what}", source=str(path),
                           hint="save it without the index column: df.to_csv(path, index=False)"
                           if text.header and not text.header[0] else "among more columns (a weight, a time), "
                           "a header line naming the source and destination (src,dst,weight) says which to read")

    def columns(a: np.ndarray) -> np.ndarray:
        if a.shape[1] != 2:
            raise wrong_columns(a.shape[1])
        return a[:, ::-1] if text.swapped else a

    if text.fields != 2 and not text.use:  # before pandas' dtype complaint about a weight column
        raise wrong_columns(text.fields)

    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    try:
        if pd is not None:
            done = 0
            names = dtype is str  # a name may hold a #: only whole-line comments are comments
            with comment_lines_blanked(path) if names else nullcontext(path) as source:
                for df in pd.read_csv(source, sep=text.sep, header=0 if text.header else None,
                                      usecols=list(text.use) if text.use else None, comment=None if names else "#",
                                      chunksize=chunk, dtype=dtype, engine="c", na_filter=not names):
                    if names:  # white space around a name is no part of it, as in the node and label tables
                        df = df.apply(lambda c: c.str.strip())
                    a = columns(df.to_numpy())
                    if names and (empty := pd.isna(a) | (a == "")).any():  # a name: "" is no id
                        k = int(np.argwhere(empty)[0][0])
                        raise MomentError(f"edge {done + k + 1:,} ({', '.join(map(repr, a[k].tolist()))}) lacks an "
                                          "id: each line needs two", source=str(path))
                    done += a.shape[0]
                    yield a
        else:  # pragma: no cover
            yield columns(np.loadtxt(path, dtype=np.int64 if dtype is not str else str, comments="#",
                                     delimiter="," if text.sep == "," else None, ndmin=2, skiprows=text.skip,
                                     usecols=sorted(text.use) if text.use else None))
    except MomentError:
        raise
    except Exception as e:  # noqa: BLE001 - pandas' ParserError and friends, reported with the file name
        if isinstance(e, UnicodeDecodeError):
            raise unreadable(path, e) from None
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "No columns" in msg:
            return
        if (m := re.fullmatch(r"invalid literal for int\(\) with base 10: (.*)", msg)) is not None:
            raise MomentError(f"the id {m.group(1)} is not an integer: without --renumber or --node-ids the ids are "
                              "node numbers 0..N-1", source=str(path), hint="--renumber reads names (and the graph's "
                              "own integer ids), numbers them 0..N-1 and keeps them") from None
        if (m := re.search(r"for (float64|uint64) dtyped data in column (\d+)", msg)) is not None:
            column = "source" if int(m.group(2)) == (text.use[0] if text.use else int(text.swapped)) else "destination"
            if m.group(1) == "uint64":
                raise MomentError(f"an id of the {column} column is beyond 2^63 - 1", source=str(path),
                                  hint="--renumber numbers the graph's own ids, of any size, 0..N-1") from None
            raise MomentError(f"the {column} column holds a number that is not an integer id (such as 1.5)",
                              source=str(path), hint="ids are integers, or names with --renumber") from None
        raise MomentError(f"cannot parse edge list: {msg}", source=str(path)) from None


def _random_features(n: int, d: int, seed: int) -> Iterator[np.ndarray]:
    step = max(1, CHUNK_BYTES // (4 * d))
    for k, s in enumerate(range(0, n, step)):
        yield np.random.default_rng([seed, 5, k]).standard_normal((min(step, n - s), d), dtype=np.float32)

