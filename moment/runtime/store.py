"""The tiered feature store: own GPU cache -> peer GPU caches -> shared CPU cache -> SSD shards.

Why this shape (Moment §3.1, Hyperion §III-A/B): every rank looks a node up in the fastest tier that
holds it, and reads the rest from the SSD shards through *its own* I/O stack, with submission and
completion split (`submit` / `complete`) so the reads of batch i+1 run while batch i trains.

Tiers, per rank (the layout decides which node is where; `index.npy` maps node -> (bin, slot)):

* ``gpu``  — the GPU-cache bins this rank owns (bin j of the layout's GPU bins belongs to the local
  rank j % local_world_size), loaded whole into a tensor on `device` (on CPU runs: this process's
  memory, standing in for device memory).
* ``peer`` — GPU-cache bins owned by other local ranks (NVLink/P2P on a real server). Served from the
  shared host mapping of their rows file, like the CPU cache.
* ``cpu``  — CPU-cache bins: the layout's unpadded ``.rows`` files memory-mapped read-only
  (MAP_SHARED). The page cache *is* the shared segment: every rank of the machine maps the same
  physical pages, nothing is copied per rank, and nothing outlives the processes (a /dev/shm
  segment would need a creator, a cleanup and would leak when torchrun kills a rank). The files are
  prefetched with POSIX_FADV_WILLNEED at open; `close()` (or process exit) unmaps them.
  `cpu_cache_limit` keeps only the hottest rows of each CPU bin in this tier; the rest are read
  through the I/O stack like SSD rows.
* ``ssd``  — SSD shards, read with O_DIRECT through this rank's `IOStack`. Packed rows (several per
  aligned block) and neighbouring rows are merged into one request (runs of up to `max_request`
  bytes; `merge_gap` > 0 also reads across gaps that small), so hot rows, which DDAK stores
  contiguously, cost few requests.

`verify=True` checks the cache files' chunk checksums at open and each SSD chunk (manifest
`chunk_sha256`) the first time a read touches it, so damaged data raises instead of being returned.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from moment.errors import MomentError
from moment.io import IOStack, ReadBatch
from moment.placement.manifest import Shard
from moment.placement.reader import load_manifest, shard_path

TIERS = ("gpu", "peer", "cpu", "ssd")
_GPU, _PEER, _CPU, _SSD = range(4)
GROUP, ATTR = "node", "x"  # the PyG FeatureStore key of the features


@dataclass
class TierCounters:
    """Rows and logical bytes served per tier, plus what the I/O stack actually read."""

    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    ssd_requests: int = 0
    ssd_bytes_read: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"rows": dict(self.rows), "bytes": dict(self.bytes), "ssd_requests": self.ssd_requests,
                "ssd_bytes_read": self.ssd_bytes_read}


@dataclass
class Pending:
    """A gather in flight: cache rows already copied, SSD reads submitted."""

    n: int
    host: np.ndarray  # uint8 [n, row_bytes]; rows of host tiers land here
    gpu_pos: torch.Tensor | None
    gpu_idx: torch.Tensor | None
    tickets: list[int]
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # staging [k, align], positions, row in staging


def parse_size(text: str | int | None, total: int) -> int | None:
    """'512MiB', '2GB', '10%' (of `total`), or a plain byte count -> bytes; None stays None."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.]+)\s*(%|[kKmMgGtT]i?[bB]?|[bB])?\s*", str(text))
    if not m:
        raise MomentError(f"cannot read size {text!r}", hint="use bytes, e.g. 512MiB, 2GB, or a percentage: 10%")
    v, unit = float(m.group(1)), (m.group(2) or "b").lower()
    if unit == "%":
        return int(total * v / 100)
    scale = {"b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[unit[0]]
    if "i" in unit:
        scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit[0]]
    return int(v * scale)


def _map_rows(path: Path, rows: int, stride: int) -> np.ndarray:
    if rows == 0:
        return np.zeros((0, stride), dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(rows, stride))


def _check_chunks(path: Path, s: Shard, chunks: np.ndarray | None = None) -> None:
    """Re-hash the given chunks (all when None) of a layout file against the manifest."""
    ks = range(len(s.chunk_sha256)) if chunks is None else chunks.tolist()
    with open(path, "rb") as f:
        for k in ks:
            data = os.pread(f.fileno(), s.chunk_bytes, k * s.chunk_bytes)
            if hashlib.sha256(data).hexdigest() != s.chunk_sha256[k]:
                off = k * s.chunk_bytes
                raise MomentError(
                    f"bin {s.bin}: checksum mismatch in chunk {k} (bytes {off}..{off + s.chunk_bytes}); "
                    "refusing to return its rows", source=str(path),
                    hint="the layout is damaged: run `moment layout verify` and rewrite it")


class TieredFeatureStore(FeatureStore):
    """Gathers node features from a layout, bit-exactly as stored in the dataset.

    Use `gather(ids)`, or `submit(ids)` now and `complete(pending)` later from the same thread.
    Also a read-only PyG `FeatureStore` with one tensor, ``store["node", "x", index]``.
    """

    def __init__(self, layout_path: str | Path, rank: int = 0, local_rank: int = 0, world_size: int = 1,
                 device: torch.device | str = "cpu", *, local_world_size: int | None = None,
                 io_backend: str | None = None, queue_depth: int = 128, direct: bool = True,
                 verify: bool = False, cpu_cache_limit: str | int | None = None, merge_gap: int = 0,
                 max_request: int = 128 << 10):
        super().__init__()
        self.path = Path(layout_path)
        self.manifest = m = load_manifest(self.path)
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.local_world_size = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        self.device = torch.device(device)
        self.verify = verify
        self.dtype = np.dtype(m.dataset.dtype)
        self.row_shape = tuple(m.dataset.row_shape)
        self.row_bytes = m.row.row_bytes
        self.num_nodes = m.dataset.num_nodes
        self.counters = TierCounters()
        self._check_files()
        self.index = np.load(self.path / m.index.path, mmap_mode="r")  # shared page cache, not copied
        nb = len(m.shards)
        self._tier = np.full(nb, _SSD, dtype=np.int8)
        self._file = np.full(nb, -1, dtype=np.int32)  # I/O stack file index of disk-read bins
        self._stride = np.array([s.stride for s in m.shards], dtype=np.int64)
        self._limit = np.full(nb, np.iinfo(np.int64).max, dtype=np.int64)  # cached slots < limit
        self._maps: dict[int, np.ndarray] = {}
        self._gpu_base = np.zeros(nb, dtype=np.int64)
        self._verified: dict[int, np.ndarray] = {}
        gpu_bins = [i for i, s in enumerate(m.shards) if s.kind == "gpu"]
        own = [b for j, b in enumerate(gpu_bins) if j % self.local_world_size == local_rank % self.local_world_size]
        limit = parse_size(cpu_cache_limit, m.dataset.num_nodes * self.row_bytes)
        paths: list[Path] = []
        parts = []
        for i, s in enumerate(m.shards):
            fp = shard_path(self.path, s)
            if s.kind == "ssd":
                self._file[i] = len(paths)
                paths.append(fp)
                self._verified[i] = np.zeros(len(s.chunk_sha256), dtype=bool)
                continue
            if verify:
                _check_chunks(fp, s)
            if i in own:
                self._tier[i] = _GPU
                self._gpu_base[i] = sum(p.shape[0] for p in parts)
                parts.append(np.fromfile(fp, dtype=np.uint8).reshape(s.rows, s.stride))
                continue
            self._tier[i] = _PEER if s.kind == "gpu" else _CPU
            self._maps[i] = _map_rows(fp, s.rows, s.stride)
            keep = s.rows
            if s.kind == "cpu" and limit is not None:
                keep = min(s.rows, limit // self.row_bytes)
                limit -= keep * self.row_bytes
                if keep < s.rows:  # the colder rest is read from the rows file like an SSD
                    self._limit[i] = keep
                    self._file[i] = len(paths)
                    paths.append(fp)
            if keep:
                self._advise(fp, keep * s.stride)
        self._gpu = (torch.from_numpy(np.concatenate(parts)) if parts
                     else torch.zeros((0, self.row_bytes), dtype=torch.uint8)).to(self.device)
        self.stack = IOStack(paths, queue_depth=queue_depth, backend=io_backend, direct=direct,
                             alignment=m.row.align) if paths else None
        self._align = m.row.align
        self.merge_gap, self.max_request = int(merge_gap), int(max_request)

    # ------------------------------------------------------------------ setup

    def _check_files(self) -> None:
        for s in self.manifest.shards:
            fp = shard_path(self.path, s)
            if not fp.is_file():
                raise MomentError(f"{s.kind} shard of bin {s.bin} is missing", source=str(fp),
                                  hint="the layout is incomplete or its SSD is not mounted")
            size = fp.stat().st_size
            if size != s.bytes:
                raise MomentError(f"shard of bin {s.bin}: size {size} B, manifest says {s.bytes} B",
                                  source=str(fp), hint="the shard was truncated or replaced; rewrite the layout")

    @staticmethod
    def _advise(path: Path, nbytes: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    @property
    def backend(self) -> str:
        return self.stack.backend if self.stack else "none"

    @property
    def feature_dim(self) -> int:
        return int(np.prod(self.row_shape))

    # ------------------------------------------------------------------ gather

    def _ids(self, node_ids) -> np.ndarray:
        if isinstance(node_ids, torch.Tensor):
            node_ids = node_ids.detach().cpu().numpy()
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise MomentError(f"node ids must be in [0, {self.num_nodes})", source=str(self.path))
        return ids

    def submit(self, node_ids) -> Pending:
        """Copy cached rows, submit the SSD reads, return without waiting for them."""
        ids = self._ids(node_ids)
        n = ids.shape[0]
        ent = np.asarray(self.index[ids])
        b, slot = ent[:, 0], ent[:, 1]
        tier = self._tier[b]
        disk = (tier == _SSD) | (slot >= self._limit[b])
        tier = np.where(disk, _SSD, tier)
        host = np.empty((n, self.row_bytes), dtype=np.uint8)
        c = self.counters
        for t in (_GPU, _PEER, _CPU, _SSD):
            k = int(np.count_nonzero(tier == t))
            c.rows[TIERS[t]] += k
            c.bytes[TIERS[t]] += k * self.row_bytes
        gpu_pos = gpu_idx = None
        sel = np.flatnonzero(tier == _GPU)
        if sel.size:
            gpu_pos = torch.from_numpy(sel)
            gpu_idx = torch.from_numpy(self._gpu_base[b[sel]] + slot[sel])
        hosted = np.flatnonzero((tier == _PEER) | (tier == _CPU))
        if hosted.size:
            hb = b[hosted]
            for bi in np.unique(hb).tolist():
                pos = hosted[hb == bi]
                host[pos] = self._maps[bi][slot[pos], : self.row_bytes]
        tickets, blocks = self._submit_disk(np.flatnonzero(tier == _SSD), b, slot, host)
        return Pending(n, host, gpu_pos, gpu_idx, tickets, blocks)

    def _submit_disk(self, pos: np.ndarray, b: np.ndarray, slot: np.ndarray, host: np.ndarray):
        if not pos.size:
            return [], None
        bb = b[pos]
        off = slot[pos] * self._stride[bb]
        f = self._file[bb]
        if self.verify:
            self._verify_chunks(bb, off)
        ssd = self._tier[bb] == _SSD  # aligned SSD rows; the rest are CPU rows beyond the cache limit
        tickets, blocks = [], None
        if ssd.any():
            staging, rows = self._plan_runs(f[ssd], off[ssd], tickets)
            blocks = (staging, pos[ssd], rows)
            pos, f, off = pos[~ssd], f[~ssd], off[~ssd]
        if pos.size:  # CPU-cache rows beyond the limit (unaligned, unpadded): one request per row
            tickets.append(self.stack.submit(ReadBatch.rows(f, off, self.row_bytes, pos), host))
        return tickets, blocks

    def _plan_runs(self, f: np.ndarray, off: np.ndarray, tickets: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Reads covering the rows at (file f, byte offset off), merged into runs of aligned blocks.

        Rows are sorted by place; a row joins the current run when it starts within `merge_gap` bytes
        of the run's end and the run stays under `max_request` bytes, so hot rows (stored contiguously,
        hottest first) and rows sharing a block cost one request. Returns the staging buffer (a strided
        view with one row per unit of `g` bytes) and each row's index into it.
        """
        a, rb = self._align, self.row_bytes
        g = min(self.manifest.row.stride, a)  # every row starts at a multiple of g
        order = np.lexsort((off, f))
        fs, os_ = f[order], off[order]
        first = (os_ // a)
        last = (os_ + rb - 1) // a
        gap_blocks = self.merge_gap // a
        new = np.ones(fs.shape[0], dtype=bool)
        new[1:] = (fs[1:] != fs[:-1]) | (first[1:] > last[:-1] + 1 + gap_blocks)
        run = np.cumsum(new) - 1
        start = first[new][run]
        split = (first - start) // max(1, self.max_request // a)  # cap the request size
        new[1:] |= split[1:] != split[:-1]
        run = np.cumsum(new) - 1
        r_first = first[new]
        r_last = np.maximum.reduceat(last, np.flatnonzero(new))
        r_len = (r_last - r_first + 1) * a
        r_dst = np.zeros(r_len.shape[0], dtype=np.int64)
        np.cumsum(r_len[:-1], out=r_dst[1:])
        total = int(r_dst[-1] + r_len[-1])
        buf = np.empty(total + rb, np.uint8)  # + rb: the last window of the strided view stays inside
        tickets.append(self.stack.submit(ReadBatch(fs[new], r_first * a, r_len, r_dst), buf))
        staging = np.lib.stride_tricks.as_strided(buf, shape=(total // g + 1, rb), strides=(g, 1), writeable=False)
        rows = np.empty(fs.shape[0], dtype=np.int64)
        rows[order] = (r_dst[run] + os_ - r_first[run] * a) // g
        return staging, rows

    def _verify_chunks(self, bb: np.ndarray, off: np.ndarray) -> None:
        for bi in np.unique(bb).tolist():
            s = self.manifest.shards[bi]
            done = self._verified.setdefault(bi, np.zeros(len(s.chunk_sha256), dtype=bool))
            o = off[bb == bi]
            ks = np.unique(np.concatenate([o // s.chunk_bytes, (o + self.row_bytes - 1) // s.chunk_bytes]))
            todo = ks[~done[ks]]
            if todo.size:
                _check_chunks(shard_path(self.path, s), s, todo)
                done[todo] = True

    def complete(self, p: Pending) -> torch.Tensor:
        """Wait for the reads of `p`; the rows as a tensor [n, *row_shape] on `device`."""
        before = self.stack.stats.bytes_read if self.stack else 0
        for t in p.tickets:
            done = self.stack.wait(t)
            self.counters.ssd_requests += len(done.batch)
        if self.stack:
            self.counters.ssd_bytes_read += self.stack.stats.bytes_read - before
        if p.blocks is not None:
            staging, pos, rows = p.blocks
            p.host[pos] = staging[rows]
        out = torch.from_numpy(p.host)
        if self.device.type != "cpu":
            out = out.to(self.device, non_blocking=False)
        if p.gpu_pos is not None:
            out[p.gpu_pos.to(out.device)] = self._gpu[p.gpu_idx.to(self._gpu.device)]
        if p.n == 0:
            return torch.empty((0, *self.row_shape), dtype=_torch_dtype(self.dtype), device=out.device)
        return out.view(_torch_dtype(self.dtype)).reshape(p.n, *self.row_shape)

    def gather(self, node_ids) -> torch.Tensor:
        return self.complete(self.submit(node_ids))

    def tier_stats(self) -> dict[str, Any]:
        return self.counters.as_dict()

    def epoch_start(self, epoch: int) -> None:  # the FeatureSource protocol
        pass

    def close(self) -> None:
        """Stop the I/O stack and unmap the shared caches (the pages stay in the page cache)."""
        if self.stack is not None:
            self.stack.close()
            self.stack = None
        self._maps.clear()
        self.index = None

    # ------------------------------------------------------------------ PyG FeatureStore

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise MomentError("the tiered feature store is read-only (features come from the layout)")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise MomentError("the tiered feature store is read-only (features come from the layout)")

    def _check_attr(self, attr: TensorAttr) -> None:
        if (attr.group_name, attr.attr_name) != (GROUP, ATTR):
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}); this store holds "
                           f"({GROUP!r}, {ATTR!r})")

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        self._check_attr(attr)
        idx = attr.index
        if idx is None:
            idx = np.arange(self.num_nodes)
        elif isinstance(idx, slice):
            idx = np.arange(self.num_nodes)[idx]
        return self.gather(idx)

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        self._check_attr(attr)
        return (self.num_nodes, *self.row_shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=GROUP, attr_name=ATTR)]

    def __del__(self) -> None:
        if getattr(self, "stack", None) is not None:
            self.close()


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(np.zeros(1, dtype=dt)).dtype
