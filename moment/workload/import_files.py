"""Reading the files an import is given: `.npy` arrays, numeric CSV/text, and node-id lists (splits).

Why one module: every importer reads the same kinds of file, and each failure must be the same one-line
MomentError naming the file, whichever importer met it. numpy (pandas when installed) only.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TextIO

import numpy as np

from moment.errors import NPZ_ERRORS, MomentError
from moment.inputs import check_dir, check_file, exists
from moment.workload.parquet import MAGIC, NOT_HERE, is_parquet, one_column, partitions

# Imports inside functions: pandas and scipy.sparse load only for the formats that need them.

#: the file names a split may have in a splits directory (OGB writes valid, PyG users often val)
SPLIT_STEMS = {"train": ("train",), "val": ("valid", "val"), "test": ("test",)}
#: the endings a split file may have, in the order they are looked for (none: one id per line)
SPLIT_SUFFIXES = (".npy", ".parquet", ".csv.gz", ".csv", ".txt.gz", ".txt", "")


def need(path: Path, what: str) -> Path:
    """`path` as a readable file (or a directory of Parquet parts), or a MomentError saying which input is
    missing."""
    if not exists(path):
        raise MomentError(f"missing {what}", source=str(path))
    if path.is_dir() and is_parquet(path):
        return check_dir(path, what)
    if path.is_dir() and (keys := partitions(path)):
        raise MomentError(f"a Hive-partitioned Parquet table ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}),"
                          f" given as the {what}: one Parquet file or a directory of its parts is read, not partitions",
                          source=str(path), hint="write it without partitions (pandas: to_parquet(path) without "
                          "partition_cols; Spark: without partitionBy)")
    return check_file(path, what)


def load_npy(path: Path, what: str) -> np.ndarray:
    """A `.npy` array memory-mapped read-only (never read whole here), pickled objects refused."""
    need(path, what)
    magic = np.lib.format.MAGIC_PREFIX
    try:
        with open(path, "rb") as f:
            head = f.read(len(magic))
    except OSError as e:
        raise MomentError(f"cannot read it: {e.strerror}", source=str(path)) from None
    if head.startswith(MAGIC):
        raise MomentError("this is a Parquet table, not a .npy file", source=str(path), hint=NOT_HERE)
    if head != magic:  # np.load takes any other file for a pickle, and says so: not what a text file is
        raise MomentError(f"not a .npy file: it does not begin with NumPy's header (its first bytes: {head!r})",
                          source=str(path), hint="save the array with numpy.save")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except NPZ_ERRORS as e:
        raise MomentError(f"not a readable .npy file: {e}", source=str(path)) from None


#: the first bytes of a zip archive: how an `.npz` (a SciPy sparse matrix's file) is told from a `.npy`
ZIP_MAGIC = b"PK\x03\x04"


def is_zip(path: Path) -> bool:
    """Whether the readable file `path` begins as a zip archive (`.npz`) does."""
    try:
        with open(path, "rb") as f:
            return f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    except OSError as e:
        raise MomentError(f"cannot read it: {e.strerror}", source=str(path)) from None


def load_sparse_edges(path: Path, what: str) -> tuple[np.ndarray, int]:
    """A square SciPy sparse adjacency saved with `scipy.sparse.save_npz` -> its entries as edges [2, E]
    (row -> column, PyG's `edge_index` from `adj.tocoo()`) and its node count. Explicit zeros are no edge.

    Read whole: an `.npz` member cannot be memory-mapped (about 2 x E ids in memory)."""
    import scipy.sparse as sp

    need(path, what)
    hint = "save it with scipy.sparse.save_npz"
    if not is_zip(path):
        raise MomentError("not an .npz archive (a SciPy sparse matrix's file is a zip archive)", source=str(path),
                          hint=hint)
    try:
        with np.load(path, allow_pickle=False) as z:
            names = sorted(z.files)
        if "format" not in names:
            raise MomentError(f"an .npz archive without a SciPy sparse matrix in it (it holds "
                              f"{', '.join(names) or 'nothing'})", source=str(path), hint=hint)
        m = sp.load_npz(path)
    except (*NPZ_ERRORS, NotImplementedError) as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise MomentError(f"not a readable SciPy sparse matrix: {text}", source=str(path), hint=hint) from None
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise MomentError(f"the adjacency must be square (one row and one column a node), got shape "
                          f"{list(m.shape)}", source=str(path))
    c = m.tocoo()
    keep = np.asarray(c.data) != 0
    rows, cols = (c.row, c.col) if keep.all() else (c.row[keep], c.col[keep])
    return np.stack([rows, cols]), int(m.shape[0])


def read_csv_chunks(path: Path, chunk_rows: int, dtype: str) -> Iterator[np.ndarray]:
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
            with open_text(path) as f:
                while True:
                    lines = [ln for _, ln in zip(range(chunk_rows), f)]
                    if not lines:
                        break
                    yield np.loadtxt(lines, delimiter=",", dtype=dtype, ndmin=2)
    except MomentError:
        raise
    except (ValueError, OSError, EOFError) as e:
        if pd is not None and isinstance(e, pd.errors.EmptyDataError):  # pandas: "No columns to parse from file"
            raise MomentError("the file is empty: no rows (or only comments)", source=str(path)) from None
        if isinstance(e, UnicodeDecodeError):
            raise unreadable(path, e) from None
        raise MomentError(f"cannot parse: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                          source=str(path)) from None
    except Exception as e:  # noqa: BLE001 - pandas' ParserError and friends, reported with the file name
        raise MomentError(f"cannot parse: {type(e).__name__}: {str(e).splitlines()[0]}", source=str(path)) from None


def open_text(path: Path) -> TextIO:
    """A text table, gzip-compressed (`.gz`) or plain, as text; a BOM (Excel's and PowerShell's CSV begin with
    one) is no part of its first field."""
    return (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8-sig")


#: the first bytes of the compressed files a text table may come as, and the compressor's name
COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
              (b"PK\x03\x04", "zip"), (b"7z\xbc\xaf\x27\x1c", "7z"))


def unreadable(path: Path, e: BaseException) -> MomentError:
    """The error for a text table that does not read as text: a compressed one named as such (only gzip is read,
    by the name's `.gz`), where the decoder's words would say only that some byte is not UTF-8."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        head = b""
    kind = next((k for magic, k in COMPRESSED if head.startswith(magic)), None)
    if kind == "gzip" and path.suffix != ".gz":
        return MomentError("gzip-compressed, but its name does not end in .gz (only such a name is read as gzip)",
                           source=str(path), hint=f"mv {path} {path}.gz")
    if kind is not None and kind != "gzip":
        return MomentError(f"{kind}-compressed: of compressed tables only gzip (.gz) is read", source=str(path),
                           hint="decompress it, or recompress it with gzip")
    if isinstance(e, UnicodeDecodeError):
        return MomentError(f"not a UTF-8 text file: it holds the byte 0x{e.object[e.start]:02x}, which such text does "
                           "not", source=str(path))
    return MomentError(f"cannot read: {e}", source=str(path))


def first_line(path: Path) -> tuple[str, list[str], int]:
    """A text table's separator (a comma if its first line has one, else white space), the first line's fields
    (blank lines and # comments skipped) and the number of lines up to it."""
    line, skip = "", 0
    try:
        with open_text(path) as f:
            for skip, ln in enumerate(f, 1):  # noqa: B007 - the count is kept
                if ln.strip() and not ln.lstrip().startswith("#"):
                    line = ln
                    break
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise unreadable(path, e) from None
    sep = "," if "," in line else r"\s+"
    fields = next(csv.reader([line.strip()])) if sep == "," else line.split()  # a quoted field may hold a comma
    return sep, [t.strip() for t in fields], skip


#: a whole line that is a comment (after any spaces): blanked to an empty line, keeping the line count
_COMMENT_LINE = re.compile(rb"(?m)^[ \t]*#[^\r\n]*")


class _CommentLinesBlanked(io.RawIOBase):
    """A text table's bytes with each whole-line `#` comment made an empty line (which the parser skips, and
    counts, so its line numbers still match the file's). pandas' own `comment="#"` also cuts a line at a `#`
    inside it, which makes the name `c#` the node `c` and drops a line beginning `#python,bob`."""

    BLOCK = 1 << 20

    def __init__(self, path: Path):
        self._f = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115 - closed in close()
        self._carry = b""  # a line not yet ended
        self._out = memoryview(b"")
        self._first = True

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        while not self._out:
            block = self._f.read(self.BLOCK)
            if self._first and block.startswith(b"\xef\xbb\xbf"):  # a byte-order mark before a comment line
                block = block[3:]
            self._first = False
            if block:
                block = self._carry + block
                cut = block.rfind(b"\n") + 1
                block, self._carry = block[:cut], block[cut:]
            else:
                block, self._carry = self._carry, b""
                if not block:
                    return 0
            self._out = memoryview(_COMMENT_LINE.sub(b"", block) if b"#" in block else block)
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def comment_lines_blanked(path: Path) -> AbstractContextManager[Path | io.BufferedReader]:
    """The file (gzip or plain) for pandas, whole-line comments blanked: for tables whose fields may hold a `#`
    (names, class names). A plain file without a `#` is given as it is (its path: pandas reads it ~5% faster
    than through the reader)."""
    if path.suffix != ".gz" and not _holds(path, b"#"):
        return nullcontext(path)
    return io.BufferedReader(_CommentLinesBlanked(path), buffer_size=_CommentLinesBlanked.BLOCK)


def _holds(path: Path, what: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            while block := f.read(_CommentLinesBlanked.BLOCK):
                if what in block:
                    return True
    except OSError:
        return True  # the reader says why
    return False


def is_number(token: str) -> bool:
    """Whether a token reads as a number (a header has none: "src,dst", or ",src,dst" with pandas' index)."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def node_ids(a: np.ndarray, num_nodes: int, source: str, what: str) -> np.ndarray:
    """A split given as node ids [K] (or [K, 1]) or as a boolean mask [N] -> int64 node ids.

    Integer arrays are always ids (a 0/1 integer vector is ambiguous; masks are boolean, as PyG's are)."""
    a = np.asarray(a)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.dtype == np.bool_:
        if a.ndim != 1:
            raise MomentError(f"{what} is a boolean mask of shape {list(a.shape)}: expected one entry per node [N]"
                              + (" (a mask with several columns holds several splits: keep one)" if a.ndim == 2
                                 else ""), source=source)
        if a.shape[0] != num_nodes:
            raise MomentError(f"{what} is a boolean mask of {a.shape[0]} entries for {num_nodes} nodes",
                              source=source)
        return np.flatnonzero(a).astype(np.int64)
    if a.dtype.kind not in "iu":
        raise MomentError(f"{what} has dtype {a.dtype}: expected integer node ids or a boolean mask",
                          source=source)
    if a.ndim != 1:
        raise MomentError(f"{what} has shape {list(a.shape)}: expected node ids [K]", source=source)
    ids = a.astype(np.int64)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise MomentError(f"node id {bad} out of range [0, {num_nodes})", source=source)
    return ids


def read_node_ids(path: Path, num_nodes: int, what: str) -> np.ndarray:
    """A split file -> int64 node ids: `.npy` or Parquet ids or boolean mask, else text/CSV (gzip or not), one id
    a line."""
    need(path, what)
    if path.suffix == ".npy":
        return node_ids(load_npy(path, what), num_nodes, str(path), what)
    if is_parquet(path):
        return node_ids(one_column(path, what), num_nodes, str(path), what)
    return node_ids(read_id_column(path, what), num_nodes, str(path), what)


def read_id_column(path: Path, what: str) -> np.ndarray:
    """A text/CSV file (gzip or not) of one integer id a line -> int64 ids, in the C parser's chunks."""
    chunks = list(read_csv_chunks(path, 1 << 22, "int64"))
    for c in chunks:
        if c.ndim == 2 and c.shape[1] != 1:
            raise MomentError(f"{what}: expected one node id a line, got {c.shape[1]} columns", source=str(path))
    return np.concatenate([c.reshape(-1) for c in chunks]) if chunks else np.zeros(0, np.int64)


def split_files(directory: str | Path) -> list[Path]:
    """The train, val and test files of a splits directory (`train`, `valid` or `val`, `test`, each `.npy`,
    `.csv(.gz)`, `.txt(.gz)` or no ending); exactly one file a split."""
    d = check_dir(directory, "splits directory")
    out = []
    for part, stems in SPLIT_STEMS.items():
        found = [d / f"{s}{x}" for s in stems for x in SPLIT_SUFFIXES if (d / f"{s}{x}").is_file()]
        if not found:
            names = " or ".join(f"{s}.npy/.csv(.gz)/.txt" for s in stems)
            raise MomentError(f"no {part} split file ({names})", source=str(d))
        if len(found) > 1:
            raise MomentError(f"several {part} split files ({', '.join(p.name for p in found)}): keep one",
                              source=str(d))
        out.append(found[0])
    return out
