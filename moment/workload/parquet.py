"""Parquet tables (edge lists, node and label tables, lists of ids) read in record batches.

Why: graphs exported from Spark, DuckDB, BigQuery or pandas (`df.to_parquet`) come as Parquet: typed,
compressed columns in row groups. Read a batch at a time, a table larger than memory imports in memory
bounded by its row groups (the unit pyarrow decodes); and its column types say what text makes the importer guess (ids that are integers or names, which
line is a header). pyarrow reads them; it loads only when a file is Parquet (the `parquet` extra).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError

# Imports inside functions: pyarrow, which loads only for an import given a Parquet file.

#: the first (and last) four bytes of every Parquet file
MAGIC = b"PAR1"
#: what a command that takes arrays says when given a Parquet file
NOT_HERE = ("a Parquet table imports with `moment data import edgelist`: as the edge list, --node-table, --label-table, "
            "--node-ids or a --splits file")
#: what pandas names an unnamed index it keeps as a column (`__index_level_0__`): not the user's data
_PANDAS_INDEX = "__index_level_"


def _magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def parts(path: Path) -> list[Path]:
    """The Parquet files of a directory (what Spark's `df.write.parquet(DIR)` and pyarrow's datasets write:
    part-00000-....parquet and so on), in name order, which is their rows' order; its other files (_SUCCESS,
    .crc checksums, hidden ones) left out."""
    try:
        return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")) and _magic(p))
    except OSError:  # a directory this process may not list: not one of Parquet parts it can read
        return []


def partitions(path: Path) -> list[str]:
    """The `key=value` sub-directories of a Hive-partitioned Parquet table (pandas' `partition_cols`, Spark's
    `partitionBy`): a partition's rows carry its key in the directory's name, not in its files, and their order
    across partitions is not the table's, so it is refused by name rather than read in part."""
    try:
        return sorted(d.name for d in path.iterdir() if d.is_dir() and "=" in d.name and parts(d))
    except OSError:
        return []


def is_parquet(path: Path) -> bool:
    """Whether `path` is a Parquet file (by its first bytes, whatever its name), or a directory of them."""
    return bool(parts(path)) if path.is_dir() else _magic(path)


def parquet_output(path: str | Path) -> bool:
    """Whether an output is written as Parquet: by its name, as it does not exist yet (`.parquet`)."""
    return Path(path).suffix.lower() == ".parquet"


def check_matrix_output(path: str | Path, what: str) -> None:
    """A matrix (embeddings) is written as `.npy` or, by its name, Parquet: another ending got `.npy` bytes
    under a name such as `e.csv`, which no reader of that name could read."""
    if not parquet_output(path) and Path(path).suffix.lower() != ".npy":
        raise MomentError("embeddings are written as .npy or .parquet: name the file so", source=f"{what} {path}")


def need_pyarrow(what: str, source: str) -> Any:
    """`pyarrow.parquet`, or one error saying that `what` needs it and how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MomentError(f"{what} needs pyarrow", source=source,
                          hint="pip install 'moment[parquet]' (or pip install pyarrow)") from None
    return pq


def _kind(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    for kind, test in (("integer", pa.types.is_integer), ("float", pa.types.is_floating),
                       ("float", pa.types.is_decimal), ("text", pa.types.is_string),
                       ("text", pa.types.is_large_string), ("boolean", pa.types.is_boolean),
                       ("list", pa.types.is_list), ("list", pa.types.is_large_list),
                       ("list", pa.types.is_fixed_size_list)):
        if test(t):
            return kind
    return str(t)


class Table:
    """A Parquet file's (or a directory of them: `parts`) columns (`names`, their `kinds`: integer, float, text,
    boolean, list, or the type), read `rows` at a time; the column pandas kept a named index in
    (`df.set_index("id")`) comes first."""

    def __init__(self, path: Path, what: str):
        pq = need_pyarrow(f"the {what} is a Parquet file, and reading Parquet", str(path))
        self.path, self.what = path, what
        self.files = []
        paths = parts(path) if path.is_dir() else [path]
        for p in paths:
            try:
                self.files.append(pq.ParquetFile(p))
            except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid and OSError, reported with the file name
                raise MomentError(f"cannot read the {what} as Parquet: {_first_line(e)}", source=str(p)) from None
        schema = self.files[0].schema_arrow
        for p, f in zip(paths, self.files):
            if not f.schema_arrow.equals(schema, check_metadata=False):
                raise MomentError(f"its columns differ from those of the first part ({_columns(f.schema_arrow)} "
                                  f"against {_columns(schema)}): every part of the {what} has the same",
                                  source=str(p))
        if twice := sorted({n for n in schema.names if schema.names.count(n) > 1}):
            raise MomentError(f"two columns are named {twice[0]!r}: a column is read by its name", source=str(path))
        names = [n for n in schema.names if not n.startswith(_PANDAS_INDEX)]
        index = [c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)]
        kept = index[0] if len(index) == 1 and index[0] in names else None
        #: the user's columns, a kept index first (pandas writes it last)
        self.names = [kept, *(n for n in names if n != kept)] if kept else names
        self.kinds = {n: _kind(schema.field(n).type) for n in self.names}

    def type(self, name: str) -> Any:
        return self.files[0].schema_arrow.field(name).type

    def listed(self) -> str:
        return ", ".join(f"{n!r} ({self.kinds[n]})" for n in self.names) or "none"

    def batches(self, columns: list[str], rows: int) -> Iterator[list[Any]]:
        """The columns' pyarrow arrays, `rows` rows at a time (dictionary-encoded ones decoded), a row group
        decoded at a time. Why not `iter_batches`: it reads ahead, holding more of the file the further it gets
        (5M names in 5 row groups: 96 -> 212 MiB allocated by the last batch, against 87 throughout here)."""
        try:
            for f in self.files:
                for g in range(f.num_row_groups):
                    for b in f.read_row_group(g, columns=columns).to_batches(max_chunksize=rows):
                        yield [_decoded(b.column(i)) for i in range(len(columns))]
        except MomentError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt page or column chunk, reported with the file name
            raise MomentError(f"cannot read the {self.what}: {_first_line(e)}", source=str(self.path)) from None


def _columns(schema: Any) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _decoded(a: Any) -> Any:
    import pyarrow as pa

    return a.dictionary_decode() if pa.types.is_dictionary(a.type) else a


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _first_null(a: Any) -> int:
    return int(np.flatnonzero(a.is_null().to_numpy(zero_copy_only=False))[0])


def ids(a: Any, kind: str) -> np.ndarray:
    """A column of ids (no nulls: checked by the caller) as int64, or names as str objects."""
    if kind == "integer":
        v = a.to_numpy(zero_copy_only=False)
        if v.dtype == np.uint64 and v.size and int(v.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"id {int(v.max())} is above 2^63 - 1")
        return v.astype(np.int64, copy=False)
    return a.to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class Coded:
    """A chunk of names as its distinct names (`names`, str objects) and, for each id, its position among them
    (`index`, the chunk's shape). Why: Parquet's names are hashed in C++ (pyarrow's dictionary_encode), so a
    Python string is made, and numbered (`moment.workload.renumber.NameCodes`), once a chunk per distinct
    name rather than once per id: most ids of a large graph's chunk repeat a name."""

    names: np.ndarray
    index: np.ndarray


def id_pairs(t: Table, columns: tuple[str, str], as_text: bool, rows: int, noun: str) -> Iterator[np.ndarray | Coded]:
    """[K, 2] chunks of two id columns (an edge list's): int64, or with `as_text` (names are always read so)
    `Coded` names. A null or empty id is one error naming its row (`noun` K)."""
    for c in columns:
        if t.kinds[c] not in ("integer", "text"):
            raise MomentError(f"column {c!r} holds {t.kinds[c]} values: ids are integers or names", source=str(t.path))
    names = [c for c in columns if t.kinds[c] == "text"]
    if names and not as_text:
        raise MomentError(f"column {names[0]!r} holds names, not node numbers", source=str(t.path),
                          hint="--renumber numbers the graph's own ids (names too) 0..N-1 and keeps them")
    done = 0
    for a, b in t.batches(list(columns), rows):
        for col in (a, b):
            if col.null_count:
                k = _first_null(col)
                raise MomentError(f"{noun} {done + k + 1:,} lacks an id (a null in its row)", source=str(t.path))
        if as_text:
            pair = _coded(a, b)
            if (empty := (pair.names == "")[pair.index]).any():
                k = int(np.argwhere(empty)[0][0])
                raise MomentError(f"{noun} {done + k + 1:,} ({', '.join(map(repr, pair.names[pair.index[k]].tolist()))}) "
                                  "lacks an id: each row needs two", source=str(t.path))
        else:
            try:
                pair = np.stack([ids(a, t.kinds[columns[0]]), ids(b, t.kinds[columns[1]])], axis=1)
            except ValueError as e:
                raise MomentError(str(e), source=str(t.path), hint="--renumber numbers the graph's own ids (these "
                                  "too, kept as their digits) 0..N-1") from None
        done += len(a)
        yield pair


def _coded(a: Any, b: Any) -> Coded:
    """Two columns of ids as the chunk's distinct names and each id's position among them (integers as their
    digits, as text reads them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    coded = pc.dictionary_encode(pa.concat_arrays([c if c.type == pa.string() else pc.cast(c, pa.string())
                                                   for c in (a, b)]))
    index = coded.indices.to_numpy(zero_copy_only=False).astype(np.int64).reshape(2, -1).T
    return Coded(coded.dictionary.to_numpy(zero_copy_only=False), index)


def pick_pair(t: Table, first: set[str], second: set[str], what: str) -> tuple[str, str]:
    """The two columns of an edge list: its only two, or the one named as a source (`first`) and the one
    named as a destination (`second`) among more."""
    named = [[n for n in t.names if n.strip().lower() in names] for names in (first, second)]
    if all(len(n) == 1 for n in named) and named[0] != named[1]:
        return named[0][0], named[1][0]
    if len(t.names) == 2:
        return t.names[0], t.names[1]
    raise MomentError(f"a Parquet {what} needs two id columns, or one named as the source ({'/'.join(sorted(first)[:4])}"
                      f"...) and one as the destination: it has {len(t.names)}: {t.listed()}", source=str(t.path))


def one_column(path: Path, what: str) -> np.ndarray:
    """A table of one column of ids (or a boolean mask): int64, str names, or bool."""
    t = Table(path, what)
    if len(t.names) != 1:
        raise MomentError(f"{what}: expected one column of node ids, got {len(t.names)}: {t.listed()}",
                          source=str(path))
    (c,) = t.names
    kind = t.kinds[c]
    if kind not in ("integer", "text", "boolean"):
        raise MomentError(f"{what}: column {c!r} holds {kind} values: expected node ids (integers or names) or a "
                          "boolean mask", source=str(path))
    chunks = []
    for (a,) in t.batches([c], 1 << 20):
        if a.null_count:
            raise MomentError(f"{what}: row {sum(map(len, chunks)) + _first_null(a) + 1:,} is null", source=str(path))
        chunks.append(a.to_numpy(zero_copy_only=False) if kind == "boolean" else ids(a, kind))
    if not chunks:
        return np.zeros(0, np.int64)
    out = np.concatenate(chunks)
    return out.astype(str) if kind == "text" else out


def node_rows(t: Table, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A node table's (ids, float32 features [K, D]) chunks: an id column (a kept index, else the first), then
    one numeric column a feature, or one list column holding each node's vector. A null id or feature, or
    vectors of unequal length, is one error naming the node's row."""
    if len(t.names) < 2:
        raise MomentError(f"a node table needs an id column and its features, got {len(t.names)} column: {t.listed()}",
                          source=str(t.path))
    key, feats = t.names[0], t.names[1:]
    if t.kinds[key] not in ("integer", "text"):
        raise MomentError(f"the id column {key!r} holds {t.kinds[key]} values: ids are integers or names",
                          source=str(t.path))
    vector = len(feats) == 1 and t.kinds[feats[0]] == "list"
    if vector and (inner := _kind(t.type(feats[0]).value_type)) not in ("integer", "float", "boolean"):
        raise MomentError(f"column {feats[0]!r} holds lists of {inner} values: a node's vector holds numbers",
                          source=str(t.path))
    bad = [c for c in feats if t.kinds[c] not in ("integer", "float", "boolean")] if not vector else []
    if bad:
        raise MomentError(f"column {bad[0]!r} holds {t.kinds[bad[0]]} values: a node table's columns after the id are "
                          "numbers (a feature each) or one list column (each node's vector)", source=str(t.path))
    done, width = 0, None
    for key_col, *cols in t.batches([key, *feats], rows):
        if key_col.null_count:
            raise MomentError(f"row {done + _first_null(key_col) + 1:,} has no id", source=str(t.path))
        got = ids(key_col, t.kinds[key])
        if vector:
            x, width = _vectors(cols[0], width, got, done, t)
        else:
            x = np.stack([c.to_numpy(zero_copy_only=False).astype(np.float32) for c in cols], axis=1)
        if not np.isfinite(x).all():
            row = int(np.argwhere(~np.isfinite(x))[0][0])
            raise MomentError(f"the features of node {got[row]} (row {done + row + 1:,}) are missing, NaN or infinite",
                              source=str(t.path))
        done += len(got)
        yield got, x


def _vectors(a: Any, width: int | None, got: np.ndarray, done: int, t: Table) -> tuple[np.ndarray, int]:
    """A list column's vectors as [K, width] float32: every node's the same length (the first's)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(a).to_numpy(zero_copy_only=False)
    if a.null_count:
        k = _first_null(a)
        raise MomentError(f"the features of node {got[k]} (row {done + k + 1:,}) are missing", source=str(t.path))
    width = int(lengths[0]) if width is None and len(lengths) else width
    if (off := np.flatnonzero(lengths != width)).size:
        k = int(off[0])
        raise MomentError(f"node {got[k]} (row {done + k + 1:,}) has {int(lengths[k])} features, the first node "
                          f"{width}: every vector the same length", source=str(t.path))
    if not width:
        raise MomentError("the nodes' feature vectors are empty", source=str(t.path))
    values = a.flatten().to_numpy(zero_copy_only=False)
    if values.dtype == object:  # nulls inside the vectors
        values = np.array([np.nan if v is None else v for v in values], np.float32)
    return values.astype(np.float32, copy=False).reshape(-1, width), width


def label_rows(t: Table, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A label table's (ids, labels as text) chunks: integers and whole floats as their digits, names as they
    are, booleans as 0 and 1, a null or NaN as "" (no label)."""
    if len(t.names) != 2:
        raise MomentError(f"a label table needs two columns (id, label), got {len(t.names)}: {t.listed()}",
                          source=str(t.path))
    key, label = t.names
    if t.kinds[key] not in ("integer", "text"):
        raise MomentError(f"the id column {key!r} holds {t.kinds[key]} values: ids are integers or names",
                          source=str(t.path))
    kind = t.kinds[label]
    if kind not in ("integer", "float", "text", "boolean"):
        raise MomentError(f"the label column {label!r} holds {kind} values: expected class numbers or names",
                          source=str(t.path))
    done = 0
    for key_col, lab in t.batches([key, label], rows):
        if key_col.null_count:
            raise MomentError(f"row {done + _first_null(key_col) + 1:,} has no id", source=str(t.path))
        got = ids(key_col, t.kinds[key])
        if kind == "text":
            tokens = np.array(["" if x is None else x for x in lab.to_pylist()], dtype=str)
        else:
            missing = lab.is_null().to_numpy(zero_copy_only=False)
            v = lab.fill_null(False if kind == "boolean" else 0).to_numpy(zero_copy_only=False).astype(np.float64)
            missing = missing | np.isnan(v)
            if kind == "float" and (frac := np.flatnonzero(~missing & (v != np.round(v)))).size:
                k = int(frac[0])
                raise MomentError(f"node {got[k]} (row {done + k + 1:,}) has label {v[k]}: a class is a whole number or "
                                  "a name", source=str(t.path))
            tokens = np.where(missing, "", np.where(missing, 0, v).astype(np.int64).astype(str))
        done += len(got)
        yield got, tokens
