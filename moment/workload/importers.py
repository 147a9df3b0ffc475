"""Importers from published dataset layouts into Moment's on-disk format (`moment.workload.graph`).

Why: the systems this product compares with report on OGB and IGB; an import must reproduce their
graphs exactly, in bounded memory, and fail with a message that names the offending file.

Supported layouts (paths relative to the directory given on the command line):

* **OGB node property prediction** (`ogbn-*` after download/unzip), either
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
  Friendster), so such a dataset measures systems, not accuracy.

Edges u -> v land in row v (v aggregates from u). The CSR is built in two passes over chunks
(count rows, then scatter into a scratch file) and a third pass sorts and de-duplicates each row.
"""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from moment.errors import NPZ_ERRORS, MomentError
from moment.inputs import check_dir, check_file, exists
from moment.workload.graph import CHUNK_BYTES, GraphDataset, GraphWriter, index_dtype, label_dtype
from moment.workload.seeds import check_seed

Progress = Callable[[int, int], None]
EDGE_CHUNK = 1 << 22  # edges per chunk in every pass


# --------------------------------------------------------------------------------------------- helpers


def _need(path: Path, what: str) -> Path:
    if not exists(path):
        raise MomentError(f"missing {what}", source=str(path))
    return check_file(path, what)


#: bytes of memory per node while the CSR is built (counts, indptr, cursor / out_ptr, labels: int64 each)
CSR_BYTES_PER_NODE = 32


def check_build_size(n: int, generated_row_bytes: int, out_dir: Path, source: str, why: str = "") -> None:
    """Before allocating anything: do `n` nodes fit in the memory available (and the generated features
    on the disk)? Ids are array indices, so one stray huge id means a huge graph."""
    from moment.sizes import available_memory, fmt_size

    need = n * CSR_BYTES_PER_NODE
    avail = available_memory()
    hint = "node ids must be numbered 0..N-1: renumber them, or check --num-nodes"
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


def _read_csv_chunks(path: Path, chunk_rows: int, dtype: str) -> Iterator[np.ndarray]:
    """Numeric CSV (gzip or plain) in row chunks; pandas' C parser when installed, numpy otherwise."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is optional
        pd = None
    try:
        if pd is not None:
            reader = pd.read_csv(path, header=None, chunksize=chunk_rows, dtype=dtype, comment="#",
                                 na_values=["nan", "NaN", ""], keep_default_na=True)
            for df in reader:
                yield df.to_numpy()
        else:  # pragma: no cover
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt") as f:
                while True:
                    lines = [ln for _, ln in zip(range(chunk_rows), f)]
                    if not lines:
                        break
                    yield np.loadtxt(lines, delimiter=",", dtype=dtype, ndmin=2)
    except MomentError:
        raise
    except (ValueError, OSError, EOFError) as e:
        raise MomentError(f"cannot parse: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                          source=str(path)) from None
    except Exception as e:  # noqa: BLE001 - pandas' ParserError and friends, reported with the file name
        raise MomentError(f"cannot parse: {type(e).__name__}: {str(e).splitlines()[0]}", source=str(path)) from None


def _labels_to_int(raw: np.ndarray, source: str) -> np.ndarray:
    a = np.asarray(raw)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise MomentError(f"labels must be a vector [N] or [N, 1], got shape {list(a.shape)}", source=source)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a)
        if np.any(a[~bad] != np.floor(a[~bad])):
            raise MomentError("labels must be whole numbers", source=source)
        out = np.where(bad, -1, a).astype(np.int64)
    elif a.dtype.kind in "iu":
        out = a.astype(np.int64)
    else:
        raise MomentError(f"labels must be numeric, got {a.dtype}", source=source)
    return np.where(out < 0, -1, out)


def _random_splits(labels: np.ndarray, fractions: tuple[float, float, float], seed: int) -> list[np.ndarray]:
    from moment.workload.synth import split_sizes

    labelled = np.flatnonzero(labels >= 0)
    tr, va, te = split_sizes(labelled.size, *fractions)
    pick = labelled[np.random.default_rng([seed, 3]).choice(labelled.size, size=tr + va + te, replace=False)]
    return [np.sort(pick[:tr]), np.sort(pick[tr : tr + va]), np.sort(pick[tr + va :])]


def _edge_chunks(edges: np.ndarray, layout: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) int64 chunks of an [E, 2] ("rows") or [2, E] ("cols") array, memmap or not."""
    e = edges.shape[0] if layout == "rows" else edges.shape[1]
    for s in range(0, e, EDGE_CHUNK):
        if layout == "rows":
            c = np.asarray(edges[s : s + EDGE_CHUNK])
            yield c[:, 0].astype(np.int64), c[:, 1].astype(np.int64)
        else:
            yield np.asarray(edges[0, s : s + EDGE_CHUNK]).astype(np.int64), np.asarray(
                edges[1, s : s + EDGE_CHUNK]
            ).astype(np.int64)


def build_csr(
    w: GraphWriter,
    edges: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
    num_nodes: int,
    *,
    source: str,
    undirected: bool = False,
    dedupe: bool = True,
    drop_self_loops: bool = False,
    progress: Progress | None = None,
) -> int:
    """Writes `indptr` and `indices` from (src, dst) chunks (called twice); returns the edge count.

    Memory: three int64 arrays of num_nodes plus one chunk; the scatter goes to a scratch memmap.
    """
    n = num_nodes
    counts = np.zeros(n, dtype=np.int64)
    total = 0
    for src, dst in edges():
        for name, a in (("source", src), ("destination", dst)):
            if a.size and (int(a.min()) < 0 or int(a.max()) >= n):
                bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
                raise MomentError(f"{name} node id {bad} out of range [0, {n})", source=source)
        counts += np.bincount(dst, minlength=n)
        total += dst.size
        if undirected:
            counts += np.bincount(src, minlength=n)
            total += src.size
    indptr = np.concatenate([[0], np.cumsum(counts)])
    scratch_path = w.tmp / "scratch-indices.bin"
    scratch = np.lib.format.open_memmap(scratch_path, mode="w+", dtype=np.int64, shape=(max(total, 1),))
    cursor = indptr[:-1].copy()
    done = 0
    for src, dst in edges():
        rows, vals = (np.concatenate([dst, src]), np.concatenate([src, dst])) if undirected else (dst, src)
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
    # third pass: sort (and de-duplicate) each row, in row chunks of ~EDGE_CHUNK edges
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    ix = w.stream("indices", index_dtype(n), ())
    written = 0
    bounds = np.searchsorted(indptr, np.arange(0, total + EDGE_CHUNK, EDGE_CHUNK), side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(bounds, 0, n), [n]]))
    for a, b in itertools.pairwise(bounds):
        a, b = int(a), int(b)
        seg = np.asarray(scratch[indptr[a] : indptr[b]])
        rows = np.repeat(np.arange(a, b, dtype=np.int64), counts[a:b])
        if drop_self_loops:
            keep = seg != rows
            seg, rows = seg[keep], rows[keep]
        if n < 2**31:
            key = (rows - a) * n + seg
            key.sort()
            if dedupe and key.size:
                key = key[np.concatenate([[True], key[1:] != key[:-1]])]
            rows = key // n
            seg = key - rows * n
            rows += a
        else:  # pragma: no cover - ids beyond 2**31 need a two-key sort
            o = np.lexsort((seg, rows))
            rows, seg = rows[o], seg[o]
            if dedupe and seg.size:
                keep = np.concatenate([[True], (rows[1:] != rows[:-1]) | (seg[1:] != seg[:-1])])
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
    return written


def _write_features(w: GraphWriter, chunks: Iterator[np.ndarray], n: int, source: str) -> None:
    fw = None
    for c in chunks:
        c = np.asarray(c)
        if c.ndim != 2:
            raise MomentError(f"features must be a matrix [N, D], got shape {list(c.shape)}", source=source)
        if fw is None:
            dt = c.dtype if c.dtype.name in ("float32", "float16") else np.float32
            fw = w.stream("features", dt, (c.shape[1],), rows=n)
        if c.shape[1] != fw.row_shape[0]:
            raise MomentError(f"rows have {c.shape[1]} values, earlier rows {fw.row_shape[0]}", source=source)
        if fw.written + c.shape[0] > n:
            raise MomentError(f"more feature rows than the graph's {n} nodes", source=source)
        if c.dtype.kind == "f" and not np.isfinite(c).all():
            raise MomentError("features contain NaN or infinity", source=source)
        fw.write(c)
    if fw is None or fw.written != n:
        got = 0 if fw is None else fw.written
        raise MomentError(f"wrong row count: {got} feature rows for {n} nodes", source=source)
    w.finish("features")


def _matrix_chunks(a: np.ndarray) -> Iterator[np.ndarray]:
    step = max(1, CHUNK_BYTES // max(1, a.shape[1] * a.dtype.itemsize)) if a.ndim == 2 else 1 << 20
    for s in range(0, a.shape[0], step):
        yield np.asarray(a[s : s + step])


def _finish(
    w: GraphWriter, labels: np.ndarray, splits: list[np.ndarray], num_classes: int | None, source: dict, names: list[str]
) -> GraphDataset:
    n = labels.shape[0]
    k = int(num_classes) if num_classes else (int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 1)
    if labels.size and labels.max() >= k:
        raise MomentError(f"label {int(labels.max())} >= number of classes {k}", source=names[0])
    w.write_array("labels", labels, label_dtype(k))
    for name, idx, src in zip(("train_idx", "val_idx", "test_idx"), splits, names[1:]):
        idx = np.asarray(idx).astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise MomentError(f"node id {bad} out of range [0, {n})", source=src)
        if idx.size and (labels[idx] < 0).any():
            raise MomentError("split contains unlabelled nodes", source=src)
        w.write_array(name, idx)
    return w.commit(num_classes=k, source=source)


def _load_npy(path: Path, what: str) -> np.ndarray:
    _need(path, what)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except NPZ_ERRORS as e:
        raise MomentError(f"not a readable .npy file: {e}", source=str(path)) from None


# --------------------------------------------------------------------------------------------- OGB


def import_ogb(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    split_name: str | None = None,
    undirected: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports an unzipped OGB node-property-prediction dataset (CSV or NPZ raw layout)."""
    root = check_dir(src_dir, "OGB dataset directory")
    raw = root / "raw"
    npz = raw / "data.npz"
    if not npz.is_file():
        _need(raw / "edge.csv.gz", "edge list (raw/edge.csv.gz or raw/data.npz)")
    split_dir = _ogb_split_dir(root, split_name)
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        if npz.is_file():
            try:
                data = np.load(npz, allow_pickle=False)
                ei, feat = data["edge_index"], data["node_feat"]
            except NPZ_ERRORS as e:
                raise MomentError(f"need arrays edge_index and node_feat: {e}", source=str(npz)) from None
            lab_path = _need(raw / "node-label.npz", "node labels (node-label.npz)")
            try:
                labels = _labels_to_int(np.load(lab_path, allow_pickle=False)["node_label"], str(lab_path))
            except NPZ_ERRORS as e:
                raise MomentError(f"need array node_label: {e}", source=str(lab_path)) from None
            if ei.ndim != 2 or ei.shape[0] != 2:
                raise MomentError(f"edge_index must have shape [2, E], got {list(ei.shape)}", source=str(npz))
            if feat.ndim != 2:
                raise MomentError(f"node_feat must have shape [N, D], got {list(feat.shape)}", source=str(npz))
            n = feat.shape[0]
            if labels.shape[0] != n:
                raise MomentError(f"{labels.shape[0]} labels for {n} nodes", source=str(lab_path))
            build_csr(w, lambda: _edge_chunks(ei, "cols"), n, source=f"{npz}:edge_index", undirected=undirected,
                      progress=progress)
            _write_features(w, _matrix_chunks(feat), n, f"{npz}:node_feat")
            kind = "ogb-npz"
        else:
            edge_csv = _need(raw / "edge.csv.gz", "edge list (raw/edge.csv.gz or raw/data.npz)")
            lab_csv = _need(raw / "node-label.csv.gz", "node labels")
            feat_csv = _need(raw / "node-feat.csv.gz", "node features")
            labels = _labels_to_int(np.concatenate(list(_read_csv_chunks(lab_csv, 1 << 22, "float64"))), str(lab_csv))
            n = labels.shape[0]
            nn_file = raw / "num-node-list.csv.gz"
            if nn_file.is_file():
                declared = int(next(_read_csv_chunks(nn_file, 16, "int64"))[0, 0])
                if declared != n:
                    raise MomentError(f"says {declared} nodes but node-label.csv.gz has {n} rows", source=str(nn_file))
            spool = _spool_csv_edges(w, edge_csv)
            build_csr(w, lambda: _edge_chunks(spool, "rows"), n, source=str(edge_csv), undirected=undirected,
                      progress=progress)
            spool = None
            (w.tmp / "scratch-edges.npy").unlink()
            _write_features(w, _read_csv_chunks(feat_csv, 1 << 16, "float32"), n, str(feat_csv))
            kind = "ogb-csv"
        names = [str(raw / "node-label")]
        splits = []
        for part in ("train", "valid", "test"):
            f = _need(split_dir / f"{part}.csv.gz", f"{part} split")
            splits.append(np.concatenate(list(_read_csv_chunks(f, 1 << 22, "int64"))).reshape(-1))
            names.append(str(f))
        src = {"importer": kind, "from": str(root.resolve()), "split": split_dir.name, "undirected": undirected}
        return _finish(w, labels, splits, None, src, names)


def _ogb_split_dir(root: Path, split_name: str | None) -> Path:
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


def _spool_csv_edges(w: GraphWriter, path: Path) -> np.ndarray:
    """Parses the edge CSV once into a scratch [E, 2] int64 .npy so the CSR passes can re-read it fast."""
    sw = w.stream("scratch-edges", np.int64, (2,))
    for c in _read_csv_chunks(path, EDGE_CHUNK, "int64"):
        if c.ndim != 2 or c.shape[1] != 2:
            sw.abort()
            raise MomentError(f"expected two columns (src,dst), got {c.shape[1] if c.ndim == 2 else 1}", source=str(path))
        sw.write(c)
    sw.close()
    w._open.pop("scratch-edges")
    return np.load(w.tmp / "scratch-edges.npy", mmap_mode="r")


# --------------------------------------------------------------------------------------------- IGB


IGB_LABELS = {"19": "node_label_19.npy", "2K": "node_label_2K.npy", "2k": "node_label_2K.npy"}


def import_igb(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    classes: str = "19",
    undirected: bool = True,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports one IGB size directory (the one holding `processed/`); see the module docstring."""
    root = check_dir(src_dir, "IGB dataset directory")
    if classes not in IGB_LABELS:
        raise MomentError(f"classes must be 19 or 2K, got {classes!r}")
    paper = root / "processed" / "paper"
    feat = _load_npy(paper / "node_feat.npy", "node features")
    lab_path = paper / IGB_LABELS[classes]
    labels = _labels_to_int(np.asarray(_load_npy(lab_path, f"labels ({IGB_LABELS[classes]})")), str(lab_path))
    ei_path = root / "processed" / "paper__cites__paper" / "edge_index.npy"
    ei = _load_npy(ei_path, "edge index")
    if feat.ndim != 2:
        raise MomentError(f"expected [N, D], got shape {list(feat.shape)}", source=str(paper / "node_feat.npy"))
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
        build_csr(w, lambda: _edge_chunks(ei, layout), n, source=str(ei_path), undirected=undirected,
                  progress=progress)
        _write_features(w, _matrix_chunks(feat), n, str(paper / "node_feat.npy"))
        num_classes = 19 if classes == "19" else 2983
        src = {"importer": "igb", "from": str(root.resolve()), "classes": classes, "undirected": undirected}
        return _finish(w, labels, splits, max(num_classes, int(labels.max()) + 1), src,
                       [str(lab_path), str(root), str(root), str(root)])


# --------------------------------------------------------------------------------------------- edge list


def import_edgelist(
    edges_file: str | Path,
    out_dir: str | Path,
    *,
    features: str | Path | None = None,
    labels: str | Path | None = None,
    num_nodes: int | None = None,
    feature_dim: int = 128,
    num_classes: int = 2,
    undirected: bool = False,
    fractions: tuple[float, float, float] = (0.01, 0.005, 0.005),
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports a "src dst" text edge list, with optional features/labels `.npy` files."""
    check_seed(seed)
    path = _need(Path(edges_file), "edge list file")
    for given, what in ((features, "features file"), (labels, "labels file")):
        if given:
            _need(Path(given), what)  # before the edges are read
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        sw = w.stream("scratch-edges", np.int64, (2,))
        hi = -1
        for c in _read_edge_text(path):
            if c.size and int(c.min()) < 0:
                sw.abort()
                raise MomentError(f"negative node id {int(c.min())}", source=str(path))
            hi = max(hi, int(c.max()) if c.size else -1)
            sw.write(c)
        sw.close()
        w._open.pop("scratch-edges")
        spool = np.load(w.tmp / "scratch-edges.npy", mmap_mode="r")
        feat = _load_npy(Path(features), "features file") if features else None
        lab = None
        if labels:
            lp = Path(labels)
            lab = _labels_to_int(np.asarray(_load_npy(lp, "labels file")), str(lp))
        sizes = [x for x in (num_nodes, None if feat is None else feat.shape[0], None if lab is None else lab.shape[0])
                 if x is not None]
        n = sizes[0] if sizes else hi + 1
        if feat is not None and feat.ndim != 2:
            raise MomentError(f"features must be [N, D], got shape {list(feat.shape)}", source=str(features))
        for what, src, k in (("features", features, None if feat is None else feat.shape[0]),
                             ("labels", labels, None if lab is None else lab.shape[0])):
            if k is not None and k != n:
                raise MomentError(f"wrong row count: {k} {what} rows for {n} nodes", source=str(src))
        if hi >= n:
            raise MomentError(f"node id {hi} out of range [0, {n})", source=str(path),
                              hint="--num-nodes (or the features/labels rows) must exceed the largest id")
        if n <= 0:
            raise MomentError("no edges and no node count", source=str(path))
        check_build_size(n, feature_dim * 4 if feat is None else 0, w.out_dir, str(path),
                         why=f"the largest node id is {hi:,}, so " if n == hi + 1 and not num_nodes else "")
        build_csr(w, lambda: _edge_chunks(spool, "rows"), n, source=str(path), undirected=undirected,
                  progress=progress)
        spool = None
        (w.tmp / "scratch-edges.npy").unlink()
        if feat is None:
            _write_features(w, _random_features(n, feature_dim, seed), n, "generated")
        else:
            _write_features(w, _matrix_chunks(feat), n, str(features))
        if lab is None:
            lab = np.random.default_rng([seed, 4]).integers(0, num_classes, size=n)
            k = num_classes
        else:
            k = max(int(lab.max()) + 1, 1)
        splits = _random_splits(lab, fractions, seed)
        src = {"importer": "edgelist", "from": str(path.resolve()), "undirected": undirected,
               "generated_features": features is None, "generated_labels": labels is None}
        return _finish(w, lab, splits, k, src, [str(labels or path), str(path), str(path), str(path)])


def _read_edge_text(path: Path) -> Iterator[np.ndarray]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            sample = next((ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")), "")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise MomentError(f"cannot read: {e}", source=str(path)) from None
    sep = "," if "," in sample else r"\s+"
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    try:
        if pd is not None:
            for df in pd.read_csv(path, sep=sep, header=None, comment="#", chunksize=EDGE_CHUNK, dtype="int64",
                                  engine="c"):
                a = df.to_numpy()
                if a.shape[1] != 2:
                    raise MomentError(f"expected 2 columns (src dst), got {a.shape[1]}", source=str(path))
                yield a
        else:  # pragma: no cover
            a = np.loadtxt(path, dtype=np.int64, comments="#", delimiter="," if sep == "," else None, ndmin=2)
            if a.shape[1] != 2:
                raise MomentError(f"expected 2 columns (src dst), got {a.shape[1]}", source=str(path))
            yield a
    except MomentError:
        raise
    except Exception as e:  # noqa: BLE001 - pandas' ParserError and friends, reported with the file name
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "No columns" in msg:
            return
        raise MomentError(f"cannot parse edge list: {msg}", source=str(path)) from None


def _random_features(n: int, d: int, seed: int) -> Iterator[np.ndarray]:
    step = max(1, CHUNK_BYTES // (4 * d))
    for k, s in enumerate(range(0, n, step)):
        yield np.random.default_rng([seed, 5, k]).standard_normal((min(step, n - s), d), dtype=np.float32)

