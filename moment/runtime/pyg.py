"""PyG's `FeatureStore` and `GraphStore` interfaces over a feature source and a `CSRGraph`, so that
`NeighborLoader(data=(PygFeatureStore(store), PygGraphStore(graph)), ...)` samples the graph the way PyG
does and reads every batch's rows through Moment's tiers:

    layout = Layout.open(path)
    features = PygFeatureStore(open_tiers(layout))  # the layout's CPU bins in RAM, the rest from the SSDs
    graph = PygGraphStore(CSRGraph.from_dataset(layout.dataset, in_memory=False))  # memory-mapped

The feature store reads through the same `submit`/`complete` calls the training pipeline uses, so a PyG
user's `store["node", "x", idx]` takes exactly the path a training batch takes (tiers, checksums, I/O
shape). Under torchrun a lookup reads the rows of the other GPUs' caches (the peer tier's) from this rank's
own tiers, in no collective, so one rank may look up alone (PyG's examples test on rank 0). On a machine's
part of a split layout, each lookup is a round of the machines' collective exchange: there every rank makes
its lookups and then calls `source.finish()` (as the pipeline does after a training epoch), or all make as
many (a `multi_get_tensor` is one lookup).

Indices: PyG's own `TensorAttr.is_set` compares a field with `!=` against its "unset" marker, which a
NumPy index answers elementwise, so `TensorAttr.is_fully_specified` fails ("the truth value of an array
with more than one element is ambiguous") before a store sees the index. This store's attribute class
(`NodeAttr`) compares by identity, and every entry point (`store[...]`, views, `get_tensor`,
`multi_get_tensor`, `get_tensor_size`) re-casts PyG's own `TensorAttr` into it first; `node_ids` then
reads any index PyG users write and refuses a bad one with one error naming the problem.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeAttr, EdgeLayout

from moment.errors import MomentError
from moment.runtime.budget import fmt_bytes, resolve_budget
from moment.runtime.node_index import node_ids
from moment.runtime.pipeline import Turns
from moment.workload.sampler import CSRGraph

GROUP, ATTR = "node", "x"  # the key the features are found under
EDGE_TYPE = (GROUP, "to", GROUP)  # the graph's one edge type: u -> v for every in-neighbour u of v
_UNSET = TensorAttr().index  # PyG's marker of a field not given (compared by identity, never with ==)

__all__ = ["ATTR", "EDGE_TYPE", "GROUP", "NodeAttr", "PygFeatureStore", "PygGraphStore", "node_ids"]


def _read_only(what: str) -> MomentError:
    return MomentError(f"the {what} is read-only (it comes from the layout or dataset)")


class NodeAttr(TensorAttr):
    """PyG's `TensorAttr`, its fields' "set" test by identity: PyG's `!=` fails on a NumPy index."""

    def is_set(self, key: str) -> bool:
        return getattr(self, key) is not _UNSET


def _attr(*args: Any, **kwargs: Any) -> Any:
    """PyG's cast of `args` (a tuple, a TensorAttr, fields), always as a `NodeAttr` (a copy, never the
    caller's own object changed)."""
    a = NodeAttr.cast(*args, **kwargs)
    if isinstance(a, TensorAttr) and type(a) is not NodeAttr:
        a = NodeAttr(a.group_name, a.attr_name, a.index)
    return a


# ------------------------------------------------------------------------------------------- features


class PygFeatureStore(FeatureStore):
    """Read-only: ``store["node", "x", idx]``, ``store["node"].x[idx]``, ``get_tensor(...)``,
    ``multi_get_tensor([...])`` (one read for all), with any index `node_ids` reads."""

    def __init__(self, source: Any, turns: Turns | None = None):
        """`turns`: the run's (a lookup pauses the loader part-way that has the source; moment.runtime.pipeline)."""
        super().__init__(tensor_attr_cls=NodeAttr)
        self.source, self.turns = source, turns
        self.num_nodes = int(source.num_nodes)
        self.row_shape = tuple(source.row_shape)

    # PyG's entry points, each given a NodeAttr before PyG's own checks see the index
    def get_tensor(self, *args: Any, convert_type: bool = False, **kwargs: Any) -> Any:
        return super().get_tensor(_attr(*args, **kwargs), convert_type=convert_type)

    def multi_get_tensor(self, attrs: list[Any], convert_type: bool = False) -> list[Any]:
        return super().multi_get_tensor([_attr(a) for a in attrs], convert_type=convert_type)

    def get_tensor_size(self, *args: Any, **kwargs: Any) -> tuple[int, ...] | None:
        return super().get_tensor_size(_attr(*args, **kwargs))

    def view(self, *args: Any, **kwargs: Any) -> Any:
        return super().view(_attr(*args, **kwargs))

    def __getitem__(self, key: Any) -> Any:
        attr = _attr(key)
        return self.get_tensor(attr) if attr.is_fully_specified() else self.view(attr)

    # read-only: refused before PyG looks at the attribute
    def put_tensor(self, tensor: Any, *args: Any, **kwargs: Any) -> bool:
        raise _read_only("feature store")

    def remove_tensor(self, *args: Any, **kwargs: Any) -> bool:
        raise _read_only("feature store")

    def update_tensor(self, tensor: Any, *args: Any, **kwargs: Any) -> bool:
        raise _read_only("feature store")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise _read_only("feature store")

    def __delitem__(self, key: Any) -> None:
        raise _read_only("feature store")

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise _read_only("feature store")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise _read_only("feature store")

    def _check_attr(self, attr: TensorAttr) -> None:
        if (attr.group_name, attr.attr_name) != (GROUP, ATTR):
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}); this store holds "
                           f"({GROUP!r}, {ATTR!r})")

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        """Every attribute's rows in one read (one batch through the tiers, one exchange round)."""
        parts = []
        for a in attrs:
            self._check_attr(a)
            parts.append(node_ids(a.index, self.num_nodes, "feature store index"))
        if not parts:
            return []
        ids = parts[0][0] if len(parts) == 1 else np.concatenate([p for p, _ in parts])
        if self.turns is not None:
            self.turns.take(None)
        rows = self.source.complete(self.source.submit(ids))
        out = torch.split(rows, [p.size for p, _ in parts]) if len(parts) > 1 else (rows,)
        return [o[0] if scalar else o for o, (_, scalar) in zip(out, parts, strict=True)]

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        self._check_attr(attr)
        return (self.num_nodes, *self.row_shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=GROUP, attr_name=ATTR)]


# ------------------------------------------------------------------------------------------- the graph


class PygGraphStore(GraphStore):
    """A `CSRGraph` as PyG's read-only graph store, of one edge type, ``("node", "to", "node")``.

    Row v of the CSR holds v's in-neighbours (the sources u of the edges u -> v), which is PyG's CSC of
    (source, destination): ``get_edge_index(edge_type=EDGE_TYPE, layout="csc")`` is ``(row, colptr) =
    (indices, indptr)``, the graph's own tensors (a memory-mapped graph stays mapped, never read whole),
    what PyG's `NeighborSampler` asks for. Its ids are `index_dtype` (int64: PyG's samplers take int64 ids),
    so a graph stored with int32 ids is widened once per call (a copy of 8 bytes per edge); None keeps the
    stored dtype and never copies. "coo" and "csr" are derived, and materialise (COO: a destination per
    edge; CSR: the transpose, sorted by source, with the permutation PyG's `csr()` returns); any copy
    larger than `max_copy_bytes` (None: the memory available now, the cgroup limit or MemAvailable, which
    a larger copy could only be killed for) is refused up front, naming its size.
    """

    def __init__(self, graph: CSRGraph, *, index_dtype: torch.dtype | None = torch.int64,
                 max_copy_bytes: int | None = None):
        super().__init__()
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.num_edges = graph.num_edges
        self.index_dtype = index_dtype
        self.max_copy_bytes = max_copy_bytes

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [EdgeAttr(EDGE_TYPE, EdgeLayout.CSC, size=(self.num_nodes, self.num_nodes))]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        et = edge_attr.edge_type
        if not isinstance(et, list | tuple) or tuple(et) != EDGE_TYPE:
            return None  # PyG raises its KeyError for an edge type the store does not hold
        a, b, _ = self._layout(EdgeLayout(edge_attr.layout))
        return a, b

    def csc(self, edge_types: list[Any] | None = None, store: bool = False) -> tuple[dict, dict, dict]:
        return self._all(EdgeLayout.CSC, edge_types, store)

    def csr(self, edge_types: list[Any] | None = None, store: bool = False) -> tuple[dict, dict, dict]:
        return self._all(EdgeLayout.CSR, edge_types, store)

    def coo(self, edge_types: list[Any] | None = None, store: bool = False) -> tuple[dict, dict, dict]:
        return self._all(EdgeLayout.COO, edge_types, store)

    def _all(self, layout: EdgeLayout, edge_types: list[Any] | None, store: bool) -> tuple[dict, dict, dict]:
        """PyG's `csc()`/`csr()`/`coo()`: per edge type (ours) the two tensors and the permutation of the
        edges from the stored order (None: none)."""
        if store:
            raise _read_only("graph store")
        if edge_types is not None and any(tuple(e) != EDGE_TYPE for e in edge_types):
            raise MomentError(f"edge types {edge_types}: this graph store holds one, {EDGE_TYPE}")
        a, b, perm = self._layout(layout)
        return {EDGE_TYPE: a}, {EDGE_TYPE: b}, {EDGE_TYPE: perm}

    def _layout(self, layout: EdgeLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        g, n, e = self.graph, self.num_nodes, self.num_edges
        out = self.index_dtype or torch.int64  # what derived ids are made as
        if layout == EdgeLayout.CSC:
            self._room("csc", self._cast_bytes(g.indices) + self._cast_bytes(g.indptr), f"the ids as {out}")
            return self._ids(g.indices), self._ids(g.indptr), None
        if layout == EdgeLayout.COO:
            self._room("coo", self._cast_bytes(g.indices) + e * out.itemsize, "a destination per edge")
            dst = torch.repeat_interleave(torch.arange(n, dtype=out), torch.diff(g.indptr))
            return self._ids(g.indices), dst, None
        # CSR: the transpose, edges sorted by source (stable: a source's edges keep their destinations' order)
        self._room("csr", e * (g.indices.element_size() + 8 + out.itemsize) + (n + 1) * 8,
                   "the edges sorted by source, their permutation and destinations")
        _, perm = torch.sort(g.indices, stable=True)
        col = (torch.searchsorted(g.indptr, perm, right=True) - 1).to(out)
        rowptr = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(g.indices, minlength=n), 0, out=rowptr[1:])
        return rowptr.to(out), col, perm

    def _ids(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as `index_dtype`: itself (no copy) when it already is, or when index_dtype is None."""
        return t if self.index_dtype is None or t.dtype == self.index_dtype else t.to(self.index_dtype)

    def _cast_bytes(self, t: torch.Tensor) -> int:
        """What `_ids(t)` copies."""
        return 0 if self.index_dtype is None or t.dtype == self.index_dtype else t.numel() * self.index_dtype.itemsize

    def _room(self, layout: str, nbytes: int, what: str) -> None:
        """Refuse a copy of `nbytes` larger than `max_copy_bytes` (None: the memory available now)."""
        if not nbytes:
            return
        limit, source = self.max_copy_bytes, "max_copy_bytes"
        if limit is None:
            try:
                limit, _ = resolve_budget("auto")
            except MomentError:  # neither a cgroup limit nor /proc/meminfo: nothing to bound it by
                return
            source = "the memory available now"
        if nbytes > limit:
            raise MomentError(
                f"the {layout!r} edge index of a graph of {self.num_nodes:,} nodes and {self.num_edges:,} edges is "
                f"a copy of {fmt_bytes(nbytes)} ({what}), more than {fmt_bytes(limit)} ({source})",
                hint="layout='csc' is the graph's own arrays (with index_dtype=None never a copy); or raise "
                     "max_copy_bytes")

    def put_edge_index(self, edge_index: Any, *args: Any, **kwargs: Any) -> bool:
        raise _read_only("graph store")

    def remove_edge_index(self, *args: Any, **kwargs: Any) -> bool:
        raise _read_only("graph store")

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise _read_only("graph store")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise _read_only("graph store")
