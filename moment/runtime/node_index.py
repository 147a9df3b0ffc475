"""Node ids as a user gives them (a tensor, array, list, range, slice, int or boolean mask) -> int64 ids.

Why one place: the PyG feature store's lookups and `Run.loader(nodes=...)` take the same forms, and a bad one
must be the same one error wherever it is given (moment.runtime.pyg, moment.runtime.run).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from moment.errors import MomentError


def _shown(index: Any) -> str:
    if isinstance(index, torch.Tensor):
        return f"{str(index.dtype).removeprefix('torch.')} tensor of shape {tuple(index.shape)}"
    if isinstance(index, np.ndarray):
        return f"NumPy {index.dtype} array of shape {index.shape}"
    if isinstance(index, list | tuple):
        return f"{type(index).__name__} of {len(index)}"
    return f"{type(index).__name__} {str(index)[:40]}"


def node_ids(index: Any, num_nodes: int, what: str, past_end: str | None = None) -> tuple[np.ndarray, bool]:
    """`index` as int64 node ids, and whether it named one node (then, as in torch, one row without the
    leading dimension is meant). Reads None (every node), a slice, a range, an int, a list or tuple, a NumPy
    array or a tensor (on any device), of integer ids in [0, num_nodes), or a boolean mask with one entry
    per node (as torch indexing reads one). Refused, naming the problem: negative ids (not counted from the
    end: a negative id in a batch is a bug upstream, not a wish), ids past the last node, non-integer
    dtypes, indices of more than one dimension, a mask of another length: one error naming `what` and the
    index. `past_end`: the hint for an id past the last node (a graph with ids of its own: where to number them)."""
    if index is None:
        return np.arange(num_nodes, dtype=np.int64), False
    if isinstance(index, slice):
        return np.arange(*index.indices(num_nodes), dtype=np.int64), False
    if isinstance(index, range):
        a = np.arange(index.start, index.stop, index.step, dtype=np.int64)
    elif isinstance(index, torch.Tensor):
        if index.is_floating_point() or index.is_complex():
            raise _bad(what, index, f"node ids must be integers, not {str(index.dtype).removeprefix('torch.')}")
        a = index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray | np.generic):
        a = np.asarray(index)
    elif isinstance(index, bool):
        raise _bad(what, index, "a bool is not a node id (a mask is an array with one entry per node)")
    elif isinstance(index, int):
        a = np.asarray(index, dtype=np.int64)
    elif isinstance(index, list | tuple):
        if not index:
            return np.zeros(0, np.int64), False
        try:
            a = np.asarray(index)
        except ValueError as e:  # ragged nesting
            raise _bad(what, index, f"not an array of node ids ({e})") from None
    else:
        raise _bad(what, index, "give node ids as a tensor, NumPy array, list, range, slice or int")
    if a.dtype == np.bool_:
        if a.ndim != 1 or a.shape[0] != num_nodes:
            raise _bad(what, index, f"a boolean mask must have one entry per node ({num_nodes}), not shape {a.shape}")
        return np.flatnonzero(a).astype(np.int64), False
    if a.dtype.kind not in "iu":
        raise _bad(what, index, f"node ids must be integers, not {a.dtype}")
    scalar = a.ndim == 0
    if a.ndim > 1:
        raise _bad(what, index, f"node ids must be one-dimensional, not of shape {a.shape}")
    a = a.reshape(-1)
    if a.size:
        bad = (a >= num_nodes) if a.dtype.kind == "u" else ((a < 0) | (a >= num_nodes))
        if bad.any():
            i = int(np.argmax(bad))
            raise _bad(what, index, f"node ids must be in [0, {num_nodes}); {a[i]} at position {i} is not",
                       hint="negative ids are not counted from the end" if a[i] < 0 else past_end)
    return a.astype(np.int64, copy=False), scalar


def distinct_ids(ids: np.ndarray, index: Any, what: str) -> np.ndarray:
    """`ids` (from `node_ids`), refused when a node is given twice, naming the first repeated one (the first entry
    whose node an earlier entry named) and its two positions.

    Why here, at once: a batch's seeds are distinct nodes (the sampler's rule), and the passes split `ids` over
    the ranks and into batches: a repeat was a ValueError from the sampler at iteration, on some ranks only, and
    only for some world and batch sizes ([3, 3] failed on 1 rank, passed on 2). Every rank gives the same `ids`,
    so every rank refuses them alike, before anything is read. Sorted ids (a slice, a range, a mask) are
    distinct without a sort."""
    if ids.size < 2 or bool((ids[1:] > ids[:-1]).all()):
        return ids
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = np.flatnonzero(s[1:] == s[:-1])
    if not same.size:
        return ids
    later = order[same + 1]  # an entry whose node an earlier one named (stable: the earlier sorts first)
    k = int(np.argmin(later))
    at = int(later[k])
    first = int(np.flatnonzero(ids[:at] == ids[at])[0])
    mask = ids.size > 2 and bool(((ids == 0) | (ids == 1)).all())  # a 0/1 mask of integers, read as ids
    raise _bad(what, index, f"node {int(ids[at])} is given twice (at positions {first} and {at}): a pass's nodes "
                            f"must be distinct",
               hint="a mask of 0s and 1s is a mask as bools: give mask.astype(bool) (a tensor's mask.bool())" if mask
               else "give each node once (np.unique(ids, return_inverse=True) maps the results back to a list with "
                    "repeats)")


def _bad(what: str, index: Any, why: str, hint: str | None = None) -> MomentError:
    return MomentError(f"{what} ({_shown(index)}): {why}", hint=hint)
