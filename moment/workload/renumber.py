"""A graph's own node ids (sparse integers such as user ids, or names) numbered 0..N-1, and back.

Why: real edge lists name nodes by whatever the source system uses (SNAP's and web crawls' sparse integers,
account ids, strings); a dataset numbers them densely, since every array has one row a node. The importer
numbers them (`IdMap`) and keeps the originals beside the dataset (`node_ids`), so that a prediction for node
i can be reported under its own name, and a node named by its own id can be found (`IdMap.nodes`).
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.workload.import_files import is_number, load_npy, need, open_text, read_id_column, unreadable
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


def read_ids(path: Path, what: str, names: bool = False, defines: bool = False) -> np.ndarray:
    """A file of node ids: `.npy` or Parquet (integers, names, or a boolean mask, returned as is) or text, one id
    a line (integers when every line is one, names otherwise; blank lines and # comments skipped). `names`: the
    graph's ids are names, so a text line is one as written (`007` is not node `7`). `defines`: the file gives
    the graph's ids, so they are integers only when each is written as one (`plain_integer`), names otherwise."""
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
            got = read_id_column(path, what)  # integers: the split files' reader
        except MomentError:
            pass  # a name among them (or a line of two ids: said below)
        else:
            if not defines or first_respelt(path, ",", (0,)) is None:
                return got
            names = True  # `007` among them: every id as written
    try:
        with open_text(path) as f:
            lines = [s for s in (ln.strip() for ln in f) if s and not s.startswith("#")]
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise unreadable(path, e) from None
    if (bad := next((s for s in lines if "," in s or len(s.split()) > 1), None)) is not None:
        raise MomentError(f"{what}: expected one node id a line, got {bad[:60]!r}", source=str(path))
    return np.array(lines, dtype=str) if names else own_ids(lines)


def own_ids(tokens: list[str]) -> np.ndarray:
    """Ids read as text: integers when every one is written as one (`plain_integer`, int64), names otherwise."""
    try:
        values = [int(t) for t in tokens]
        if all(str(v) == t for v, t in zip(values, tokens)):
            return np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    return np.array(tokens, dtype=str)


def plain_integer(token: str) -> bool:
    """Whether an id is an integer written as its own decimal digits, so that reading it as the number loses
    nothing. Why: the graph's ids are names its user joins other tables on; `007`, `+7`, `7.0` and `1e3` are
    numbers a parser takes by value, which would make `007` and `7` one node and give `007` back as `7`."""
    try:
        return str(int(token)) == token
    except ValueError:
        return False


def as_number(token: str) -> str:
    """The plain spelling of a number written another way (`007` -> `7`, `1e3` -> `1000`), for a message."""
    try:
        return str(int(Decimal(token)))
    except (InvalidOperation, ValueError, OverflowError):
        return token


#: bytes a number written other than plainly has, or begins with: a sign, a point, an exponent; a zero
_ODD = np.zeros(256, bool)
_ODD[list(b"+.eE")] = True
#: bytes that end a field: white space, a comma, a quote
_ENDS = np.zeros(256, bool)
_ENDS[list(b" \t\r\n,\"")] = True
_SCAN_BLOCK = 1 << 22


def first_respelt(path: Path, sep: str, fields: tuple[int, ...], every: bool = True) -> str | None:
    """The first id of a text table (gzip or plain) in the given `fields` that is a number but not written as
    an integer's plain digits (`plain_integer`: `007`, `+7`, `7.0`), or None; header lines (no number), blank
    lines and `#` comments (whole lines or a line's end, as the integer parser reads them) are no ids.
    `every`: each line's fields are all ids (else only `fields`, the others a weight, a time).

    Why a scan of the bytes: the integer parser that reads the ids (10x faster than reading them as names)
    keeps no spelling. A vectorised pass marks the few bytes that can begin or hold another spelling, and only
    their lines are read as text: on a file of plain integers that is its header and comments."""
    opener = gzip.open if path.suffix == ".gz" else open
    carry, first = b"", True
    with opener(path, "rb") as f:
        while True:
            block = f.read(_SCAN_BLOCK)
            if first and block.startswith(b"\xef\xbb\xbf"):
                block = block[3:]
            first = False
            data = carry + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            data, carry = data[:cut], data[cut:]
            for line in _odd_lines(data, sep, fields, every):
                if (t := _respelt_in(line, sep, fields)) is not None:
                    return t
            if not block:
                return None


def _odd_lines(data: bytes, sep: str, fields: tuple[int, ...], every: bool) -> Iterator[bytes]:
    """The lines of `data` (whole lines) with a byte that may make an id of `fields` other than plain."""
    b = np.frombuffer(data, np.uint8)
    if not b.size:
        return
    # a zero that begins a field of more bytes (`007`, `0.5`), or follows a field's leading minus (`-0`, `-07`);
    # the bytes around a zero are looked at only where there is one, and a sign, point or exponent only in a
    # block that has one (a byte search): two passes over a block of plain integers
    z = np.flatnonzero(b == ord("0"))
    padded = np.concatenate(([ord("\n")], b, [ord("\n")]))
    ends = _ENDS[padded[z]], _ENDS[padded[z + 2]]  # the bytes before and after each zero end a field
    minus = (padded[z] == ord("-")) & _ENDS[padded[np.maximum(z - 1, 0)]]
    at = z[(ends[0] & ~ends[1]) | minus]
    if any(c in data for c in (b"+", b".", b"e", b"E")):
        at = np.union1d(at, np.flatnonzero(_ODD[b]))
    if not every and at.size:  # only the fields that hold ids: count the fields before each byte in its line
        gap = _ENDS[padded]
        starts = b == ord(",") if sep == "," else ~gap[1:-1] & gap[:-2]
        count = np.cumsum(starts)
        nl = np.flatnonzero(b[:-1] == ord("\n"))
        base = np.zeros(b.size, np.int64)
        base[nl + 1] = count[nl]  # the count before each line: every byte of the line takes it
        field = count - np.maximum.accumulate(base) - (0 if sep == "," else 1)
        at = at[np.isin(field[at], fields)]
    end = -1
    for i in at.tolist():
        if i <= end:
            continue  # its line was read
        start = data.rfind(b"\n", 0, i) + 1
        end = data.find(b"\n", i)
        end = len(data) if end < 0 else end
        yield data[start:end]


def _respelt_in(line: bytes, sep: str, fields: tuple[int, ...]) -> str | None:
    """The first of a line's ids in `fields` written as a number other than plainly, as the parser splits it."""
    text = line.decode("utf-8", errors="replace").split("#", 1)[0].strip()
    if not text:
        return None
    tokens = next(csv.reader([text])) if sep == "," else text.split()
    for i in fields:
        if i < len(tokens) and is_number(t := tokens[i].strip().strip('"')) and not plain_integer(t):
            return t
    return None
