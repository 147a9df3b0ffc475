"""Row copies of the gather path: `dst[dst_rows[i]] = the row at src_index[i]` in one pass.

Why not NumPy's fancy indexing (`dst[pos] = src[idx]`): it builds the gathered rows in a temporary and
copies them again, holding the GIL throughout; a batch's rows pass through two or three such copies on
their way from a finished read or the CPU cache into the batch, beside the model on the same cores. The
native `copy_rows` (native/moment_io.c) moves each row once, with the GIL released, and writes rows read in
order (a finished read's, a pack segment's) with streaming stores, which skip the cache; without the extension
the same copy is done with NumPy, byte for byte the same result.
"""

from __future__ import annotations

import numpy as np

from moment.io.engines import _native

_copy = getattr(_native, "copy_rows", None)


def copy_rows(dst: np.ndarray, dst_rows: np.ndarray | None, src: np.ndarray, src_index: np.ndarray,
              src_stride: int | None = None) -> None:
    """dst[dst_rows[i]] = the `dst.shape[1]` bytes of `src` at byte `src_index[i] * src_stride` (default
    stride: one row, so `src_index` are row numbers; 1: byte offsets). `dst_rows` None: rows 0..n-1 in
    order. `dst` a C-contiguous uint8 [rows, row_bytes] array, `src` any C-contiguous uint8 array."""
    rb = int(dst.shape[1])
    stride = rb if src_stride is None else int(src_stride)
    idx = np.ascontiguousarray(src_index, np.int64)
    rows = None if dst_rows is None else np.ascontiguousarray(dst_rows, np.int64)
    if _copy is not None and dst.flags.c_contiguous and src.flags.c_contiguous:
        _copy(dst, rows, src, idx, stride, rb)
        return
    flat = src.reshape(-1)
    view = np.lib.stride_tricks.as_strided(flat, shape=((flat.shape[0] - rb) // stride + 1, rb),
                                           strides=(stride * flat.strides[0], flat.strides[0]), writeable=False)
    if rows is None:
        dst[: idx.shape[0]] = view[idx]
    else:
        dst[rows] = view[idx]
