"""Load the C DDAK kernel (native/ddak.c); None when it cannot be had.

The package build compiles it as moment.placement._ddak (setup.py), so an installed Moment has it
without a compiler. A source checkout that was not built compiles it on first use instead, cached
under $MOMENT_CACHE (default ~/.cache/moment)/native, keyed by the source's hash, and written by
rename so concurrent first uses never load a half-written file. The kernel is optional: DDAK falls
back to an exact NumPy block method. MOMENT_NO_NATIVE=1 disables it.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.outputs import atomic_write, cache_root

SOURCE = Path(__file__).resolve().parents[2] / "native" / "ddak.c"
FLAGS = ["-O2", "-shared", "-fPIC", "-ffp-contract=off"]


def _cache_dir() -> Path:
    return cache_root() / "native"


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


def _packaged() -> Path | None:
    """The kernel the package build made (moment.placement._ddak), found without importing it."""
    try:
        spec = importlib.util.find_spec("moment.placement._ddak")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


@lru_cache(maxsize=1)
def ddak_library() -> tuple[ctypes.CDLL, str] | tuple[None, str]:
    """(library, where it came from) or (None, why there is none)."""
    if os.environ.get("MOMENT_NO_NATIVE"):
        return None, "disabled by MOMENT_NO_NATIVE"
    for origin, find in (("package build", _packaged),
                         ("compiled at first use", lambda: _build(SOURCE) if SOURCE.is_file() else None)):
        so = find()
        if so is None:
            continue
        try:
            return ctypes.CDLL(str(so)), f"{origin} ({so})"
        except OSError:
            continue
    return None, "not built (no C compiler when installed) and no source to compile"


@lru_cache(maxsize=1)
def ddak_kernel():  # -> ctypes function or None
    """The `ddak_fill` function from native/ddak.c, or None (not built, no compiler, disabled)."""
    lib, _ = ddak_library()
    if lib is None:
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
