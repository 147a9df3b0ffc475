"""A graph's own node ids (sparse integers such as user ids, or names) numbered 0..N-1, and back.

Why: real edge lists name nodes by whatever the source system uses (SNAP's and web crawls' sparse integers,
account ids, strings); a dataset numbers them densely, since every array has one row a node. The importer
numbers them (`IdMap`) and keeps the originals beside the dataset (`node_ids`), so that a prediction for node
i can be reported under its own name, and a node named by its own id can be found (`IdMap.nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.workload.import_files import load_npy, need, open_text, read_id_column, unreadable
from moment.workload.parquet import Coded, is_parquet, one_column

#: most ids an error lists of those it cannot find
SHOWN = 3


def id_kind(a: np.ndarray) -> str:
    """"integer" or "text": how ids of this array compare (text ids compare as strings)."""
    return "integer" if a.dtype.kind in "iu" else "text"


def as_text(a: np.ndarray) -> np.ndarray:
    """Ids as fixed-width strings: integers as their decimal digits, so that "17" in a file of names is 17."""
    a = np.asarray(a)
    return a if a.dtype.kind == "U" else a.astype(str)


def _comparable(a: np.ndarray, kind: str) -> np.ndarray:
    return as_text(a) if kind == "text" else a.astype(np.int64, copy=False)


def _distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array. A sort and a compare: on 8M int64 ids, 0.6 s where
    `np.unique` took 3.9."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


class IdMap:
    """Original ids in node order (`original`), searchable: `nodes(ids)` gives their node numbers."""

    def __init__(self, original: np.ndarray, source: str, counted: str = ""):
        self.original = np.asarray(original)
        if self.original.ndim != 1 or self.original.dtype.kind not in "iuU":
            raise MomentError(f"node ids must be a list of integers or names, got {self.original.dtype} "
                              f"{list(self.original.shape)}", source=source)
        if not self.original.size:
            raise MomentError("no node ids: the file lists no node", source=source)
        self.kind = id_kind(self.original)
        self.source = source
        #: what the ids are and their order, as the import's report says it
        self.counted = counted or f"{len(self):,} {'names' if self.kind == 'text' else 'integer ids'} in the order of {source}"
        self._order = np.argsort(self.original, kind="stable")
        self._sorted = self.original[self._order]
        if self._sorted.size > 1:
            same = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
            if same.size:
                raise MomentError(f"node id {self._sorted[same[0]]!s} is listed twice: each node once", source=source)

    @classmethod
    def of_sorted_unique(cls, chunks: Iterable[np.ndarray], source: str, noun: str) -> IdMap:
        """The distinct ids of `chunks` (`noun`: what they are), numbered in sorted order (integers by value,
        names as text)."""
        parts = [_distinct(np.asarray(c).reshape(-1)) for c in chunks]
        parts = [p for p in parts if p.size]
        if not parts:
            raise MomentError("no edges: nothing to number", source=source)
        kind = "text" if any(id_kind(p) == "text" for p in parts) else "integer"
        ids = _distinct(np.concatenate([_comparable(p, kind) for p in parts]))
        return cls(ids, source, f"{ids.size:,} distinct {noun} of {source}, in sorted order")

    def __len__(self) -> int:
        return int(self.original.shape[0])

    def nodes(self, ids: np.ndarray, source: str, what: str) -> np.ndarray:
        """Node numbers (int64, the shape of `ids`) of original ids; ids not among them are one error naming
        the first few, `what` and `source`."""
        a = np.asarray(ids)
        if a.dtype.kind not in "iuUSO":
            raise MomentError(f"{what} has dtype {a.dtype}: expected node ids (integers or names)", source=source)
        if a.dtype.kind in "SO":
            a = a.astype(str)
        given, outside = a, np.zeros(a.shape, bool)  # outside: integers beyond int64, so no id of the graph's
        if self.kind == "integer" and a.dtype.kind == "U":
            try:  # names read from a text file: the integer ids they spell
                a = a.astype(np.int64)
            except (ValueError, OverflowError):
                a, outside = self._wide(a, source, what)
        elif self.kind == "integer" and a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
            outside = a > np.iinfo(np.int64).max  # cast to int64 they wrapped: 2^64 - 1 was the node of id -1
            a = np.where(outside, 0, a)
        a = _comparable(a, self.kind)
        flat = a.reshape(-1)
        order = np.argsort(flat)  # searched in order, the lookups walk the sorted ids once, in cache
        pos_in = np.empty(flat.size, np.int64)
        pos_in[order] = np.minimum(np.searchsorted(self._sorted, flat[order]), len(self) - 1)
        pos_in = pos_in.reshape(a.shape)
        found = (self._sorted[pos_in] == a) & ~outside
        if not np.all(found):
            missing, first = np.unique(given[~found].reshape(-1), return_index=True)
            missing = missing[np.argsort(first, kind="stable")]  # in the order the input names them
            shown = ", ".join(str(x) for x in missing[:SHOWN])
            more = f" and {missing.size - SHOWN:,} more" if missing.size > SHOWN else ""
            nodes = "nodes" if missing.size > 1 else "node"
            raise MomentError(f"{what} names {nodes} {shown}{more}, not among the {len(self):,} node ids of "
                              f"{self.source}", source=source)
        return self._order[pos_in].astype(np.int64)

    def _wide(self, a: np.ndarray, source: str, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Text ids that are not all int64, for integer ids: a name is one error; integers beyond int64 are
        marked (`outside`, zero in the ids) to be named among the ids the graph lacks, as 999 would be (they
        ended in a bare StopIteration)."""
        values = []
        for x in a.reshape(-1).tolist():
            try:
                values.append(int(x))
            except ValueError:
                raise MomentError(f"{what} names node {x!r}, but the node ids of {self.source} are integers",
                                  source=source) from None
        lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        outside = np.array([not lo <= v <= hi for v in values], bool)
        ids = np.array([0 if o else v for v, o in zip(values, outside.tolist())], np.int64)
        return ids.reshape(a.shape), outside.reshape(a.shape)


class NameCodes:
    """Names to node numbers in one pass over an edge list's text: a dict gives each name its code as it
    comes (or, with `given`, the node number the file of ids gives it); `finish` then renumbers the codes in
    the names' sorted order. Why: measured on 2M edges of 200k names, hashing each token once (0.7 s) where
    sorting them per chunk and searching each in the sorted names took 5.3 s and a second parse."""

    def __init__(self, given: IdMap | None):
        self.given = given
        self._codes: dict[str, int] = {} if given is None else {str(x): i for i, x in enumerate(given.original.tolist())}

    def codes(self, chunk: np.ndarray | Coded, source: str, what: str) -> np.ndarray:
        """The chunk's names as int64 codes of its shape (a `Coded` chunk's: each distinct name coded once)."""
        if isinstance(chunk, Coded):
            return self.codes(chunk.names, source, what)[chunk.index]
        flat = np.asarray(chunk).reshape(-1).tolist()
        d = self._codes
        if self.given is None:
            new = d.setdefault
            got = [new(x, len(d)) for x in flat]
        else:
            get = d.get
            got = [get(x, -1) for x in flat]
        out = np.array(got, dtype=np.int64).reshape(np.shape(chunk))
        if self.given is not None and (out < 0).any():
            self.given.nodes(np.asarray(chunk)[out < 0], source, what)  # names the ones it lacks
        return out

    def finish(self, source: str) -> tuple[IdMap, np.ndarray | None]:
        """The ids, and the node number of each code (None: the codes are node numbers already)."""
        if self.given is not None:
            return self.given, None
        if not self._codes:
            raise MomentError("no edges: nothing to number", source=source)
        names = np.array(list(self._codes), dtype=str)
        order = np.argsort(names, kind="stable")
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        self._codes = {}
        return IdMap(names[order], source, f"{order.size:,} distinct names of {source}, in sorted order"), rank


def read_ids(path: Path, what: str, names: bool = False) -> np.ndarray:
    """A file of node ids: `.npy` or Parquet (integers, names, or a boolean mask, returned as is) or text, one id
    a line (integers when every line is one, names otherwise; blank lines and # comments skipped). `names`: the
    graph's ids are names, so a text line is one as written (`007` is not node `7`)."""
    need(path, what)
    if is_parquet(path):
        return one_column(path, what)
    if path.suffix == ".npy":
        a = np.asarray(load_npy(path, what))
        if a.ndim == 2 and a.shape[1] == 1:
            a = a[:, 0]
        if a.dtype.kind == "S":
            a = a.astype(str)
        if a.ndim != 1 or a.dtype.kind not in "iuUb":
            raise MomentError(f"{what} has dtype {a.dtype} and shape {list(a.shape)}: expected node ids [K] "
                              "(integers or names)", source=str(path))
        return a
    if not names:
        try:
            return read_id_column(path, what)  # integers: the split files' reader
        except MomentError:
            pass  # a name among them (or a line of two ids: said below)
    try:
        with open_text(path) as f:
            lines = [s for s in (ln.strip() for ln in f) if s and not s.startswith("#")]
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise unreadable(path, e) from None
    if (bad := next((s for s in lines if "," in s or len(s.split()) > 1), None)) is not None:
        raise MomentError(f"{what}: expected one node id a line, got {bad[:60]!r}", source=str(path))
    return np.array(lines, dtype=str) if names else own_ids(lines)


def own_ids(tokens: list[str]) -> np.ndarray:
    """Ids read as text: integers when every one is one (int64), names otherwise."""
    try:
        return np.array([int(t) for t in tokens], dtype=np.int64)
    except (ValueError, OverflowError):
        return np.array(tokens, dtype=str)
