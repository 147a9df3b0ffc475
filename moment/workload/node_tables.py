"""Node features and labels as tables keyed by the graph's own ids, as graphs are often published (Elliptic's
`txId,feature...` and `txId,class` CSVs beside its edge list; a database export of users and their attributes).

Why: such tables name each node by its id, not by a row number, and their labels are often class names
("licit", or Elliptic's "1", "2" and "unknown"); turning them into arrays in node order is the first script
every user of such data writes, and a row out of place there trains on wrong labels without an error.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.workload.graph import GraphWriter
from moment.workload.import_files import comment_lines_blanked, first_line, is_number, need, open_text, unreadable
from moment.workload.parquet import Table, is_parquet, label_rows, node_rows
from moment.workload.renumber import IdMap, own_ids

# Imports inside functions: pandas, which parses the tables, loads only for an import that has one.

ROWS = 1 << 16  # table rows parsed at once


def _chunks(path: Path, sep: str, skip: int, dtype: dict, what: str, usecols: list[int] | None = None):
    """The table's rows after its first `skip` lines (its header and any comment above it), in chunks; white
    space around a field is no part of it (`0, 1`; `alice ,1`: the edge list's `alice`, not a node of its own);
    a # within a line is (a name, a class name)."""
    import pandas as pd

    try:
        with comment_lines_blanked(path) as f:
            for df in pd.read_csv(f, sep=sep, header=None, skiprows=skip or None, skipinitialspace=sep == ",",
                                  chunksize=ROWS, dtype=dtype, engine="c", keep_default_na=False, usecols=usecols,
                                  na_values={k: [""] for k in dtype if dtype[k] is not str}):
                for k in (k for k in dtype if dtype[k] is str and k in df.columns):
                    df[k] = df[k].str.strip()
                yield df
    except MomentError:
        raise
    except pd.errors.EmptyDataError:
        return  # a header and no row: the table lists no node, which its reader says
    except UnicodeDecodeError as e:
        raise unreadable(path, e) from None
    except Exception as e:  # noqa: BLE001 - pandas' ParserError and friends, reported with the file name
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise MomentError(f"cannot parse the {what}: {msg}", source=str(path)) from None


def read_node_table(path: str | Path, w: GraphWriter) -> tuple[IdMap, str | None]:
    """Streams a node table (`id,feature,...` a line, or Parquet, `moment.workload.parquet.node_rows`) into `w`'s
    features, a row a node in the table's order; returns that order and the header line it skipped (None: none).

    A first line is a header only when every field is no number (`id,f0,f1`) or its id is not of the kind the
    other rows' ids are (`user,0,1,2`, pandas' unnamed columns, above integer ids): a first row with a missing or
    non-numeric feature is a node whose features are wrong, the same error as on any other row, not a header to
    drop without a word (an isolated node vanished with it)."""
    p = need(Path(path), "node table")
    if is_parquet(p):
        return _write_node_rows(node_rows(Table(p, "node table"), ROWS), w, p), None
    sep, first, skip = first_line(p)
    _no_index_column(first, p)
    if len(first) < 2:
        raise MomentError("a node table needs an id and at least one feature a line, got "
                          f"{len(first)} field{'s' if len(first) != 1 else ''}", source=str(p))
    header = not any(map(is_number, first)) or (
        not _integer(first[0]) and _integer_ids(p, sep, skip))
    dim = len(first) - 1
    line = ",".join(first) if header else None
    return _write_node_rows(_text_rows(p, sep, skip if header else 0, dim), w, p, line), line


def _integer(token: str) -> bool:
    """Whether an id reads as an integer, in any spelling (`007` too): a header's id does not."""
    try:
        int(token)
    except ValueError:
        return False
    return True


def _integer_ids(p: Path, sep: str, skip: int) -> bool:
    """Whether the ids after the first line are all integers (the graph's ids are then integers), read until the
    first that is not one: only for a first line whose id is a name (False when no row follows: `alice,1,2` alone
    is a node)."""
    rows = 0
    for df in _chunks(p, sep, skip, {0: str}, "node table", usecols=[0]):
        if not df.iloc[:, 0].str.fullmatch(r"\s*[+-]?\d+\s*").all():
            return False
        rows += len(df)
    return rows > 0


def _no_index_column(first: list[str], p: Path) -> None:
    """A header whose first column has no name (`,user,label`) is pandas' `to_csv` with its index: a column of row
    numbers, which would be read as the ids (nodes the graph does not have, or three fields where two are)."""
    if len(first) > 2 and first[0] == "" and all(first[1:]):
        raise MomentError(f"the first column of its header ({','.join(first)[:60]!r}) has no name: pandas' index, "
                          "which to_csv writes unless told not to", source=str(p),
                          hint="write the table with to_csv(path, index=False), or drop its first column")


def _text_rows(p: Path, sep: str, skip: int, dim: int):
    """A text node table's (ids as text, float32 features) chunks."""
    done = 0
    chunks = _chunks(p, sep, skip, {0: str, **{k: np.float32 for k in range(1, dim + 1)}}, "node table")
    while True:
        try:
            df = next(chunks, None)
        except MomentError:
            _no_number(p, sep, skip, dim)  # a field that is no number: its row and node, not pandas' words
            raise
        if df is None:
            return
        if df.shape[1] != dim + 1:
            raise MomentError(f"rows have {df.shape[1]} fields, the first {dim + 1}", source=str(p))
        x = df.iloc[:, 1:].to_numpy(np.float32)
        if not np.isfinite(x).all():
            row = int(np.argwhere(~np.isfinite(x))[0][0])
            raise MomentError(f"the features of node {df.iloc[row, 0]} (row {done + row + 1:,}) are missing, "
                              "NaN or infinite", source=str(p))
        got = df.iloc[:, 0].to_numpy()
        if (empty := got == "").any():
            raise MomentError(f"row {done + int(np.argmax(empty)) + 1:,} has no id", source=str(p))
        done += len(got)
        yield got, x


def _no_number(p: Path, sep: str, skip: int, dim: int) -> None:
    """The error naming the first feature of a text node table that is no finite number (`abc`, `nan`), its
    node and row (rows counted as the parser counts them: blank and comment lines are none); nothing when every
    feature is one (the parser failed for another reason, which it says)."""
    with open_text(p) as f:
        lines = (ln for k, ln in enumerate(f) if k >= skip and ln.strip() and not ln.lstrip().startswith("#"))
        try:
            for row, ln in enumerate(lines, 1):
                fields = [t.strip() for t in (next(csv.reader([ln.strip()])) if sep == "," else ln.split())]
                for t in fields[1:dim + 1]:
                    if not is_number(t):
                        raise MomentError(f"the features of node {fields[0]} (row {row:,}) are not all numbers: "
                                          f"{t!r}", source=str(p)) from None
                    if not math.isfinite(float(t)):
                        raise MomentError(f"the features of node {fields[0]} (row {row:,}) are missing, NaN or "
                                          "infinite", source=str(p)) from None
        except UnicodeDecodeError:
            return  # not text: the parser's error says so (`unreadable`)


def _write_node_rows(rows, w: GraphWriter, p: Path, header: str | None = None) -> IdMap:
    """The chunks' features into `w` in the table's order, and that order as the nodes' ids."""
    ids: list[np.ndarray] = []
    fw = None
    for got, x in rows:
        fw = fw or w.stream("features", np.float32, (x.shape[1],))
        ids.append(got)
        fw.write(x)
    if fw is None or not sum(map(len, ids)):
        raise MomentError("the node table lists no node" + (f" (only its header, {header[:60]!r})" if header else ""),
                          source=str(p))
    w.finish("features")
    every = np.concatenate(ids)
    return IdMap(own_ids(every.tolist()) if every.dtype == object else every, str(p))


def _two_fields(frames, p: Path):
    for df in frames:
        if df.shape[1] != 2:
            raise MomentError(f"rows have {df.shape[1]} fields: expected two (id, label)", source=str(p))
        yield df


@dataclass
class LabelTable:
    """Labels in node order (-1: no label), and the class names when the table gave names, not numbers."""

    labels: np.ndarray
    class_names: list[str] | None = None
    unlabelled: dict[str, int] = field(default_factory=dict)
    header: str | None = None  # the first line, read as the columns' names


def read_label_table(path: str | Path, ids: IdMap, num_nodes: int, unlabelled: tuple[str, ...] = ()) -> LabelTable:
    """A label table (`id,label` a line) as labels in node order. A first line whose id names no node is its
    header; a node it leaves out, or whose label is one of `unlabelled` (Elliptic's "unknown") or empty, has no
    label. Labels that are all integers are the classes; otherwise each distinct name is a class, numbered in
    sorted order."""
    p = need(Path(path), "label table")
    if is_parquet(p):
        t = Table(p, "label table")
        first, header, rows = t.names, True, label_rows(t, ROWS)
    else:
        sep, first, skip = first_line(p)
        _no_index_column(first, p)
        if len(first) != 2:
            raise MomentError(f"a label table needs two fields a line (id, label), got {len(first)}: "
                              f"{','.join(first)[:60]!r}", source=str(p))
        try:
            ids.nodes(np.array(first[:1]), str(p), "label table")
            header = False
        except MomentError:
            if ids.kind == "integer" and first[0].lstrip("-").isdigit():
                raise  # an id, not a column's name: a node the graph does not have
            header = True
        rows = ((df.iloc[:, 0].to_numpy(), df.iloc[:, 1].to_numpy().astype(str))
                for df in _two_fields(_chunks(p, sep, skip if header else 0, {0: str, 1: str}, "label table"), p))
    nodes, tokens = [], []
    for got, token in rows:
        nodes.append(ids.nodes(got, str(p), "label table"))
        tokens.append(token)
    if not sum(map(len, nodes)):
        raise MomentError("the label table lists no node" + (f" (only its header, {','.join(first)[:60]!r})"
                          if header else ""), source=str(p))
    node = np.concatenate(nodes) if nodes else np.zeros(0, np.int64)
    token = np.concatenate(tokens) if tokens else np.zeros(0, str)
    by_node = np.sort(node)
    if (twice := by_node[1:][by_node[1:] == by_node[:-1]]).size:
        raise MomentError(f"node {ids.original[twice[0]]} has two labels: one line a node", source=str(p))
    token = np.char.strip(token)
    none = np.isin(token, np.array(["", *unlabelled], dtype=str))
    counted = {t: int(np.count_nonzero(token == t)) for t in ("", *unlabelled) if np.any(token == t)}
    node, token = node[~none], _whole_numbers(token[~none], node[~none], ids, p)
    numbers = np.array([t.lstrip("-").isdigit() for t in np.unique(token).tolist()], bool)
    if numbers.all():
        value = token.astype(np.int64)
        if (value < 0).any():  # as in every importer: a negative label marks a node without one
            counted["negative"] = int(np.count_nonzero(value < 0))
            value = np.where(value < 0, -1, value)
        names = None
    elif numbers.any():
        words = np.unique(token)[~numbers].tolist()
        raise MomentError(f"labels mix class numbers and names ({', '.join(map(repr, words[:3]))}): a label is "
                          "one or the other", source=str(p), hint=f"if {words[0]!r} marks a node without a label, give --unlabelled "
                          f"{words[0]}")
    else:
        names = sorted(set(token.tolist()))
        value = np.searchsorted(np.array(names, dtype=str), token).astype(np.int64)
    labels = np.full(num_nodes, -1, np.int64)
    labels[node] = value
    return LabelTable(labels, names, counted, ",".join(first) if header else None)


def _whole_numbers(token: np.ndarray, node: np.ndarray, ids: IdMap, p: Path) -> np.ndarray:
    """Labels written as whole floats (`2.0`: pandas writes an integer column with a gap so) as their digits, so
    that they are class numbers as in a Parquet table, not names numbered in text order ('10.0' before '2.0');
    a fractional one is one error naming its node."""
    uniq, inverse = np.unique(token, return_inverse=True)
    canon = uniq.tolist()
    for k, t in enumerate(canon):
        if t.lstrip("-").isdigit() or not is_number(t) or not math.isfinite(v := float(t)):
            continue
        if v != round(v):
            i = int(np.argmax(token == t))
            raise MomentError(f"node {ids.original[node[i]]} has label {t}: a class is a whole number or a name",
                              source=str(p))
        canon[k] = str(int(v))
    return np.array(canon, dtype=str)[inverse] if canon != uniq.tolist() else token
