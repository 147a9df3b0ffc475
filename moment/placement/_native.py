"""Build and load the C DDAK kernel (native/ddak.c) on first use; None when it cannot be had.

The kernel is optional: DDAK falls back to an exact NumPy block method. The shared object is cached
under $MOMENT_CACHE (default ~/.cache/moment)/native, keyed by the source's hash, and written by
rename so concurrent first uses never load a half-written file. MOMENT_NO_NATIVE=1 disables it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.outputs import atomic_write

SOURCE = Path(__file__).resolve().parents[2] / "native" / "ddak.c"
FLAGS = ["-O2", "-shared", "-fPIC", "-ffp-contract=off"]


def _cache_dir() -> Path:
    base = os.environ.get("MOMENT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "moment")
    return Path(base) / "native"


def _build(src: Path) -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    digest = hashlib.sha256(src.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    out = _cache_dir() / f"ddak-{digest}.so"
    if out.is_file():
        return out
    try:
        with tempfile.TemporaryDirectory(prefix="moment-ddak-") as build:
            so = Path(build) / out.name
            r = subprocess.run([cc, *FLAGS, str(src), "-o", str(so), "-lm"], check=False, capture_output=True,
                               timeout=120)
            if r.returncode != 0:
                return None
            atomic_write(out, so.read_bytes())
    except (OSError, MomentError, subprocess.SubprocessError):
        return None
    return out


@lru_cache(maxsize=1)
def ddak_kernel():  # -> ctypes function or None
    """The `ddak_fill` function from native/ddak.c, or None (no source, no compiler, disabled)."""
    if os.environ.get("MOMENT_NO_NATIVE") or not SOURCE.is_file():
        return None
    so = _build(SOURCE)
    if so is None:
        return None
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        return None
    f = lib.ddak_fill
    dp = np.ctypeslib.ndpointer(np.float64, flags="C_CONTIGUOUS")
    i64p = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
    i32p = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
    u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
    i64 = ctypes.c_int64
    f.argtypes = [dp, i64, i64, ctypes.c_int32, dp, i64p, i32p, u8p, dp, i64p, i32p, i64p, i64, i64p]
    f.restype = i64
    return f
