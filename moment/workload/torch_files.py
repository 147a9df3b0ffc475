"""Opening files written with `torch.save` (PyG's and OGB's) without running code that is pickled in them.

Why: a pickle names functions that unpickling calls, so loading a stranger's `.pt` file may run anything.
Moment unpickles only what a graph needs: tensors, numpy arrays and PyG's data classes. Files that pickle
anything else are refused, naming the object, unless the user passes `--trust-pickle`
(`torch.load(weights_only=False)`: only for files they made or trust).

* `load_torch` - `torch.load(weights_only=True)` with PyG's data classes allowed, memory-mapped where the
  file allows it (a large feature tensor is then read in chunks, never whole).
* `load_numpy_pickle` - OGB's `processed/data_processed` (a dict of numpy arrays that ogb saves with
  pickle protocol 4, which torch's safe loader cannot read): a restricted unpickler that makes numpy
  arrays and plain containers and nothing else (the "restricting globals" recipe of Python's pickle
  documentation). Needs no torch.
"""

from __future__ import annotations

import codecs
import pickle
import re
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from moment.errors import INSTALL_TRAIN, MomentError
from moment.workload.parquet import MAGIC, NOT_HERE

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

TRUST_HINT = ("if you made this file or trust its source, --trust-pickle loads it with "
              "torch.load(weights_only=False), which runs any code pickled in it")
#: what a broken, cut or foreign torch file raises while it is read
_READ_ERRORS = (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError,
                AttributeError, ImportError, TypeError, KeyError, IndexError)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _pyg_globals() -> list[Any]:
    """PyG's data classes that a pickled `Data` refers to, beyond those PyG itself allows (`Data` & co.,
    registered when `torch_geometric.data` is imported): its storage and attribute records, plain data."""
    try:
        import torch_geometric.data.data as pyg_data
        import torch_geometric.data.storage as pyg_storage
    except ImportError:
        return []
    names = ((pyg_data, "DataEdgeAttr"), (pyg_data, "DataTensorAttr"), (pyg_storage, "GlobalStorage"),
             (pyg_storage, "NodeStorage"), (pyg_storage, "EdgeStorage"),
             (pyg_storage, "BaseStorage"))
    return [getattr(m, n) for m, n in names if hasattr(m, n)]


def _torch_load(torch: Any, path: Path, weights_only: bool) -> Any:
    with warnings.catch_warnings():  # torch's notes on foreign pickle protocols: the outcome is what counts
        warnings.simplefilter("ignore")
        try:
            return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # a file in torch's legacy format cannot be mapped: read it
                raise
        return torch.load(path, map_location="cpu", weights_only=weights_only)


def load_torch(path: Path, what: str, *, trust: bool = False) -> Any:
    """The object in a `torch.save` file, unpickled safely (see the module docstring) unless `trust`."""
    try:
        import torch
    except ImportError:
        raise MomentError(f"reading {what} needs torch (and torch_geometric for PyG's Data)", source=str(path),
                          hint=INSTALL_TRAIN) from None
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise MomentError(f"cannot read: {e.strerror or e}", source=str(path)) from None
    if head.startswith(MAGIC):
        raise MomentError("this is a Parquet table, not a torch file", source=str(path), hint=NOT_HERE)
    if not (head.startswith(b"PK") or head.startswith(b"\x80")):  # torch.save's zip archive, or its legacy pickle
        raise MomentError("not a torch file: it is neither the zip archive torch.save writes nor a pickle",
                          source=str(path))
    allowed = _pyg_globals()
    try:
        if trust:
            return _torch_load(torch, path, weights_only=False)
        with torch.serialization.safe_globals(allowed):
            return _torch_load(torch, path, weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if found and found.group(1).startswith("torch_geometric") and not allowed:
            raise MomentError(f"{what} holds PyG objects ({found.group(1)}): reading it needs torch_geometric "
                              "(pip install torch-geometric)", source=str(path)) from None
        if found:
            raise MomentError(f"{what} pickles {found.group(1)}, which Moment does not unpickle: loading it "
                              "would run code from the file", source=str(path), hint=TRUST_HINT) from None
        if "Unsupported operand" in text:
            raise MomentError(f"{what} uses a pickle instruction torch's safe loader cannot read",
                              source=str(path), hint=TRUST_HINT) from None
        raise MomentError(f"not a readable torch file (torch.save): {_first_line(e)}", source=str(path)) from None
    except _READ_ERRORS as e:
        raise MomentError(f"not a readable torch file (torch.save): {_first_line(e)}", source=str(path)) from None


# --------------------------------------------------------------------------------------------- numpy


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for what a pickled numpy array refers to, under numpy 1's and 2's names."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    out: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("collections", "OrderedDict"): OrderedDict,
        ("_codecs", "encode"): codecs.encode,  # how pickle protocol 2 spells bytes (torch's safe loader allows it too)
    }
    for mod in ("numpy.core", "numpy._core"):
        out[(f"{mod}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        out[(f"{mod}.multiarray", "scalar")] = core.multiarray.scalar
        if hasattr(core.numeric, "_frombuffer"):
            out[(f"{mod}.numeric", "_frombuffer")] = core.numeric._frombuffer
    dtypes = getattr(np, "dtypes", None)
    for name in dir(dtypes) if dtypes is not None else ():
        if name.endswith("DType"):
            out[("numpy.dtypes", name)] = getattr(dtypes, name)
    return out


class _NumpyUnpickler(pickle.Unpickler):
    """Makes numpy arrays, numbers, strings and containers; any other global, and torch tensors, refused."""

    def __init__(self, f: Any, allowed: dict[tuple[str, str], Any]):
        super().__init__(f)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("GLOBAL torch tensor storage")


def load_numpy_pickle(path: Path, what: str, *, trust: bool = False) -> Any:
    """The object in a `torch.save` file that holds only numpy arrays and plain containers (OGB's
    `processed/data_processed`), read by the restricted unpickler; `trust` hands the file to torch.load."""
    if trust:
        return load_torch(path, what, trust=True)
    try:
        with zipfile.ZipFile(path) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise MomentError(f"not a torch.save file: no data.pkl record in the archive ({what})",
                                  source=str(path))
            with z.open(pkl[0]) as f:
                return _NumpyUnpickler(f, _numpy_globals()).load()
    except MomentError:
        raise
    except pickle.UnpicklingError as e:
        found = re.match(r"GLOBAL (.+)", str(e))
        if found:
            raise MomentError(f"{what} pickles {found.group(1)}, which Moment does not unpickle (only numpy arrays "
                              "and plain containers): loading it would run code from the file", source=str(path),
                              hint=TRUST_HINT) from None
        raise MomentError(f"not a readable torch file (torch.save): {_first_line(e)}", source=str(path)) from None
    except zipfile.BadZipFile:
        raise MomentError(f"not a readable torch file: not the zip archive torch.save writes ({what}; a file "
                          "saved by torch before 1.6 is read only with --trust-pickle)", source=str(path)) from None
    except _READ_ERRORS as e:
        raise MomentError(f"not a readable torch file (torch.save): {_first_line(e)}", source=str(path)) from None
