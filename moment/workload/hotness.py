"""Pre-sampling: run the training sampler ahead of time and count how often each node is read.

Why: access is skewed (DiskGNN §4, Table 3: the top 1% of nodes take 14-56% of feature reads), and
the data placement (DDAK) and the caches need the per-node counts, not a guess. Counting uses exactly
the sampler training uses, so the counts describe the real access stream.

`Hotness` itself is numpy-only (the planner and placement load it without torch); `presample()`
imports torch lazily.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moment import testpoints
from moment.documents import mistaken_dir
from moment.errors import NPZ_ERRORS, MomentError, check_at_least
from moment.inputs import check_dir, exists, read_text
from moment.locking import locked
from moment.outputs import (
    atomic_file,
    check_output,
    check_replaceable,
    document_sha256,
    follow_umask,
    manifest_head,
    publish_dir,
    remove_stale,
    sha256_file,
    temp_prefix,
    write_error,
    writing,
)
from moment.workload.seeds import SEED_LIMIT, check_seed

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

if TYPE_CHECKING:
    from moment.workload.graph import GraphDataset

HOTNESS_SCHEMA = 1
HOTNESS_JSON = "hotness.json"
_ARRAYS = ("feature_reads", "adjacency_reads")


def check_hotness_out(path: str | Path) -> Path:
    """Check a hotness output directory up front: writable, and when it exists, a hotness directory that
    holds nothing but what `Hotness.save` writes (it is replaced; anything else would be lost)."""
    out = check_output(path, "--out", directory=True)
    if exists(out):
        head = manifest_head(out, HOTNESS_JSON)
        ours = head is not None and head.get("schema_version") == HOTNESS_SCHEMA and "num_nodes" in head
        check_replaceable(out, "hotness", {HOTNESS_JSON, *(f"{a}.npy" for a in _ARRAYS)} if ours else None,
                          unnamed="which `moment data presample` did not write")
    return out


TOPS = (0.01, 0.05, 0.10)


@dataclass
class Hotness:
    """Per-node access counts from pre-sampling.

    `feature_reads[v]`: number of mini-batches whose `n_id` contains v (each batch reads v's feature
    row once). `adjacency_reads[v]`: number of times v's neighbour list was sampled (v was a target
    at some hop, isolated nodes included: their indptr entry is still read).
    """

    feature_reads: np.ndarray  # int64 [num_nodes]
    adjacency_reads: np.ndarray  # int64 [num_nodes]
    num_batches: int = 0
    sampled_total: int = 0  # ids drawn before de-duplication, seeds included, all batches
    unique_ratio: float = 1.0  # mean over batches of unique / drawn
    meta: dict[str, Any] = field(default_factory=dict)  # fanouts, batch_size, seed, epochs, dataset, timing

    @property
    def num_nodes(self) -> int:
        return int(self.feature_reads.shape[0])

    @property
    def total_feature_reads(self) -> int:
        return int(self.feature_reads.sum())

    def order(self, kind: str = "feature") -> np.ndarray:
        """Node ids hottest first; ties broken by node id (stable), so placement is deterministic."""
        counts = self._counts(kind)
        return np.argsort(-counts, kind="stable")

    def share_of_top(self, fraction: float, kind: str = "feature") -> float:
        """Share of all accesses that go to the hottest `fraction` of nodes (what a cache of that size serves)."""
        counts = self._counts(kind)
        total = int(counts.sum())
        if total == 0:
            return 0.0
        k = round(fraction * counts.size)
        if k <= 0:
            return 0.0
        if k >= counts.size:
            return 1.0
        top = np.partition(counts, counts.size - k)[counts.size - k :]
        return float(top.sum()) / total

    def skew(self, tops: Sequence[float] = TOPS, kind: str = "feature") -> dict[float, float]:
        """{fraction of nodes: share of accesses to the hottest that fraction}, e.g. {0.01: 0.22, ...}."""
        counts = np.sort(self._counts(kind))[::-1]
        total = int(counts.sum())
        csum = np.cumsum(counts)
        out = {}
        for t in tops:
            k = round(t * counts.size)
            out[float(t)] = float(csum[k - 1]) / total if (k > 0 and total) else 0.0
        return out

    def curve(self, points: int = 101, kind: str = "feature") -> list[tuple[float, float]]:
        """(fraction of nodes, share of accesses) pairs for the hottest-first cumulative curve."""
        counts = np.sort(self._counts(kind))[::-1]
        total = max(int(counts.sum()), 1)
        csum = np.concatenate([[0], np.cumsum(counts)])
        xs = np.linspace(0.0, 1.0, points)
        ks = np.round(xs * counts.size).astype(np.int64)
        return [(float(x), float(csum[k]) / total) for x, k in zip(xs, ks)]

    def _counts(self, kind: str) -> np.ndarray:
        if kind == "feature":
            return self.feature_reads
        if kind == "adjacency":
            return self.adjacency_reads
        raise ValueError(f"kind must be 'feature' or 'adjacency', got {kind!r}")

    def summary(self) -> dict[str, Any]:
        return {
            "num_nodes": self.num_nodes,
            "num_batches": self.num_batches,
            "feature_reads": self.total_feature_reads,
            "adjacency_reads": int(self.adjacency_reads.sum()),
            "sampled_total": self.sampled_total,
            "unique_ratio": self.unique_ratio,
            "never_read": float(np.count_nonzero(self.feature_reads == 0)) / max(self.num_nodes, 1),
            "skew": {f"top_{t:g}": v for t, v in self.skew().items()},
            "adjacency_skew": {f"top_{t:g}": v for t, v in self.skew(kind="adjacency").items()},
            **{k: v for k, v in self.meta.items()},
        }

    def check_dataset(self, dataset: GraphDataset, *, source: str) -> None:
        """Refuse counts measured on another dataset (another node count or graph)."""
        want = dataset.manifest.files["indptr"].sha256
        if self.num_nodes != dataset.num_nodes or self.meta.get("dataset_indptr_sha256", want) != want:
            raise MomentError("this hotness was measured on another dataset", source=source,
                              hint="pre-sample this dataset, or leave out --hotness")

    def sampled_as(self, fanouts: Sequence[int] | None, batch_size: int | None, *, source: str
                   ) -> tuple[list[int] | None, int | None]:
        """The fan-outs and batch size to use these counts with: the given ones, which must be those they
        were sampled at (the counts, unique ratio and reads per epoch all change with them), or, where
        not given (None), those. Counts saved without them (older files) take what is given. The seed
        may differ: other batches of the same distribution are what a placement or a cache should learn
        from."""
        had_f, had_b = self.meta.get("fanouts"), self.meta.get("batch_size")
        bad = []
        if fanouts is not None and had_f is not None and [int(x) for x in fanouts] != list(had_f):
            bad.append(f"--fanouts {','.join(map(str, fanouts))} (pre-sampled at {','.join(map(str, had_f))})")
        if batch_size is not None and had_b is not None and int(batch_size) != int(had_b):
            bad.append(f"--batch-size {batch_size} (pre-sampled at {had_b})")
        if bad:
            raise MomentError(f"this hotness was pre-sampled with other parameters: {'; '.join(bad)}", source=source,
                              hint="pre-sample again with this run's parameters (`moment data presample --fanouts "
                                   "... --batch-size ...`), or leave those flags out to use the hotness's")
        return (list(fanouts) if fanouts is not None else had_f), (batch_size if batch_size is not None else had_b)

    # -- persistence: a directory with hotness.json + two .npy files, written atomically

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        out = check_hotness_out(path)
        with locked(out, "hotness"):
            remove_stale(out, set_aside=True)  # a killed writer's leftovers; its previous version put back
            if exists(out) and not overwrite:
                raise MomentError("output already exists", source=str(out))
            check_hotness_out(out)  # what a killed writer's recovery put back is checked too
            return self._save(out)

    def _save(self, out: Path) -> Path:
        with writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=out.parent))
        try:
            follow_umask(tmp, directory=True)
            files = {}
            for name in _ARRAYS:
                with atomic_file(tmp / f"{name}.npy") as f:
                    np.save(f, np.ascontiguousarray(getattr(self, name), dtype=np.int64))
                files[f"{name}.npy"] = {"bytes": (tmp / f"{name}.npy").stat().st_size,
                                        "sha256": sha256_file(tmp / f"{name}.npy")}
            doc = {
                "schema_version": HOTNESS_SCHEMA,
                "num_nodes": self.num_nodes,
                "num_batches": self.num_batches,
                "sampled_total": self.sampled_total,
                "unique_ratio": self.unique_ratio,
                "meta": self.meta,
                "files": files,
            }
            doc = json.loads(json.dumps(doc))  # (its checksum is of the document as it reads back)
            doc["sha256"] = document_sha256(doc)
            with atomic_file(tmp / HOTNESS_JSON, text=True) as f:
                json.dump(doc, f, indent=2)
            testpoints.reach("hotness-written")
            old = publish_dir(tmp, out, "hotness")  # a crash: the next writer's remove_stale cleans up
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):
                raise write_error(e, out, doing="cannot write the hotness") from None
            raise
        return out

    @classmethod
    def load(cls, path: str | Path) -> Hotness:
        """The hotness directory at `path`, checked where it is read, so no command uses damaged counts: its
        hotness.json's own checksum and each array file's (presample writes both; hotness written before
        them is checked without), and what every pre-sampling's counts are (`_counts_problem`). A problem is
        one error naming the file."""
        p = check_dir(path, "hotness directory")
        j = p / HOTNESS_JSON
        if not j.is_file():
            raise mistaken_dir(p, "hotness") or MomentError(
                "no hotness.json here (create it with `moment data presample`)", source=str(p))
        try:
            doc = json.loads(read_text(j, "hotness file"))
        except (json.JSONDecodeError, RecursionError) as e:
            raise MomentError(f"unreadable: {e}", source=str(j)) from None
        if not isinstance(doc, dict):
            raise MomentError("not written by `moment data presample`: not a JSON object", source=str(j))
        if doc.get("schema_version") != HOTNESS_SCHEMA:
            raise MomentError(f"schema_version {doc.get('schema_version')} not supported", source=str(j))
        missing = [k for k in ("num_nodes", "num_batches", "sampled_total", "unique_ratio") if k not in doc]
        if missing:
            raise MomentError(f"not written by `moment data presample`: no {', '.join(missing)}", source=str(j))
        if "sha256" in doc and doc["sha256"] != document_sha256(doc):
            raise MomentError("edited or damaged: its checksum does not match its content", source=str(j),
                              hint=_AGAIN)
        if why := _doc_problem(doc):
            raise MomentError(why, source=str(j), hint=_AGAIN)
        arrays = {}
        for name in _ARRAYS:
            f = p / f"{name}.npy"
            try:
                a = np.load(f, allow_pickle=False)
            except NPZ_ERRORS as e:
                raise MomentError(f"cannot read: {e}", source=str(f)) from None
            if a.shape != (doc["num_nodes"],):
                raise MomentError(f"holds counts of shape {a.shape}, but {HOTNESS_JSON} says {doc['num_nodes']:,} "
                                  "nodes", source=str(f), hint=_AGAIN)
            if a.dtype.kind not in "iu":
                nan = " (NaN among them)" if a.dtype.kind in "fc" and np.isnan(a).any() else ""
                raise MomentError(f"holds {a.dtype} values{nan}, not the integer counts pre-sampling writes",
                                  source=str(f), hint=_AGAIN)
            arrays[name] = a
        feat, adj = arrays["feature_reads"], arrays["adjacency_reads"]
        if problem := _counts_problem(feat, adj, doc):  # (before the checksums: it says what is wrong)
            raise MomentError(problem[1], source=str(p / f"{problem[0]}.npy"), hint=_AGAIN)
        for name in _ARRAYS if "sha256" in doc else ():  # what no rule sees (counts moved between nodes)
            f = p / f"{name}.npy"
            if sha256_file(f) != doc.get("files", {}).get(f.name, {}).get("sha256"):
                raise MomentError(f"edited or damaged: its checksum does not match the one {HOTNESS_JSON} "
                                  "records", source=str(f), hint=_AGAIN)
        try:
            return cls(
                feat.astype(np.int64, copy=False), adj.astype(np.int64, copy=False), int(doc["num_batches"]),
                int(doc["sampled_total"]), float(doc["unique_ratio"]), dict(doc.get("meta", {})),
            )
        except (TypeError, ValueError) as e:
            raise MomentError(f"a field has the wrong type: {e}", source=str(j)) from None


_AGAIN = "pre-sample again (`moment data presample`)"


def _doc_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with hotness.json's numbers (None: nothing): what one pre-sampling can write."""
    def count(key: str, least: int) -> bool:
        v = doc.get(key)
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    for key, least in (("num_nodes", 1), ("num_batches", 1), ("sampled_total", 1)):
        if not count(key, least):
            return f"{key} {doc.get(key)!r}: must be an integer >= {least}"
    r = doc.get("unique_ratio")
    if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 1:
        return f"unique_ratio {r!r}: must be a number in (0, 1]"
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        return "meta: must be an object"
    f, b = meta.get("fanouts"), meta.get("batch_size")
    if f is not None and not (isinstance(f, list) and f and all(isinstance(x, int) and not isinstance(x, bool)
                                                                  and x > 0 for x in f)):
        return f"meta.fanouts {f!r}: must be a list of positive integers"
    if b is not None and not (isinstance(b, int) and not isinstance(b, bool) and b > 0):
        return f"meta.batch_size {b!r}: must be a positive integer"
    files = doc.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return "files: must map each array file to its checksum"
    return None


def _counts_problem(feat: np.ndarray, adj: np.ndarray, doc: dict[str, Any]) -> tuple[str, str] | None:
    """(array, what is wrong with it), None when nothing, by what every pre-sampling's counts are: a batch reads a
    node's row at most once (0 <= feature_reads <= num_batches, in all at most the ids drawn, and some), and
    samples the neighbours of only nodes it reads, each at most once (0 <= adjacency_reads <= feature_reads)."""
    batches = int(doc["num_batches"])
    for name, a in (("feature_reads", feat), ("adjacency_reads", adj)):
        if a.min() < 0:  # (a has num_nodes >= 1 counts)
            v = int(a.argmin())
            return (name, f"negative counts (node {v}: {a[v]}): pre-sampling counts reads, never below 0")
    if feat.max() > batches:
        v = int(feat.argmax())
        return ("feature_reads", f"node {v} is counted {feat[v]} reads in {batches} batch(es): a batch reads a "
                                 "row once at most")
    total = int(feat.sum(dtype=np.uint64))
    if total == 0:
        return ("feature_reads", f"counts no reads at all in {batches} batches")
    if total > int(doc["sampled_total"]):
        return ("feature_reads", f"counts {total:,} reads, more than the {doc['sampled_total']:,} ids "
                                 f"{HOTNESS_JSON} says were drawn")
    over = np.flatnonzero(adj > feat)
    if over.size:
        v = int(over[0])
        return ("adjacency_reads", f"node {v}'s neighbours are counted sampled {adj[v]} time(s), its row read "
                                   f"only {feat[v]}: a batch samples the neighbours only of rows it reads")
    return None


def presample(
    dataset: GraphDataset,
    fanouts: Sequence[int] = (25, 10),
    batch_size: int = 1024,
    *,
    epochs: int = 1,
    num_batches: int | None = None,
    seed: int = 0,
    split: str = "train",
    in_memory: bool = True,
    threads: int | None = 1,
    progress: Callable[[int, int], None] | None = None,
) -> Hotness:
    """Samples `epochs` epochs of mini-batches (or just the first `num_batches`) and counts accesses.

    Batches come from `SeedBatches(split seeds, batch_size, seed=seed)` and `NeighborSampler(seed=seed)`,
    the same objects a single-rank training run uses. `threads` sets torch's intra-op threads for the
    run (restored after): the per-batch ops are small, and on a busy 2-core machine torch's spinning
    worker threads made sampling ~8x slower than one thread; `None` leaves torch's setting alone.
    """
    import torch

    from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches

    check_at_least("--batch-size", batch_size)
    check_at_least("--epochs", epochs)
    if any(int(f) <= 0 for f in fanouts) or not fanouts:
        raise MomentError(f"fan-outs must be positive integers (got {list(fanouts)})")
    check_seed(seed)
    seeds = np.asarray(dataset.split(split))
    if seeds.size == 0:
        raise MomentError(f"the {split} split is empty", source=str(dataset.path))
    batches = SeedBatches(seeds, batch_size, seed=seed)
    per_epoch = len(batches)
    total = per_epoch * epochs if num_batches is None else int(num_batches)
    check_at_least("--num-batches", total)
    graph = CSRGraph.from_dataset(dataset, in_memory=in_memory)
    sampler = NeighborSampler(graph, fanouts, seed=seed)
    n = dataset.num_nodes
    feat = torch.zeros(n, dtype=torch.int64)
    adj = torch.zeros(n, dtype=torch.int64)
    done, drawn, ratio_sum, epoch = 0, 0, 0.0, 0
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    t0 = time.perf_counter()
    try:
        while done < total:
            for b in batches.epoch(epoch):
                mb = sampler.sample(b)
                feat.index_add_(0, mb.n_id, torch.ones(mb.n_id.numel(), dtype=torch.int64))
                for tg in mb.targets_per_hop:
                    adj.index_add_(0, tg, torch.ones(tg.numel(), dtype=torch.int64))
                drawn += mb.num_sampled
                ratio_sum += mb.unique_ratio
                done += 1
                if progress is not None:
                    progress(done, total)
                if done >= total:
                    break
            epoch += 1
    finally:
        torch.set_num_threads(old_threads)
    elapsed = time.perf_counter() - t0
    meta = {
        "dataset": str(dataset.path),
        "dataset_indptr_sha256": dataset.manifest.files["indptr"].sha256,
        "fanouts": [int(f) for f in fanouts],
        "batch_size": int(batch_size),
        "seed": int(seed),
        "split": split,
        "epochs": epoch if num_batches is None else done / max(per_epoch, 1),
        "batches_per_epoch": per_epoch,
        "elapsed_s": elapsed,
        "sampled_per_s": drawn / elapsed if elapsed > 0 else 0.0,
    }
    return Hotness(feat.numpy(), adj.numpy(), done, drawn, ratio_sum / max(done, 1), meta)


#: batches of a held-out sample (at most one epoch's): what predictions from a hotness are read off
HELDOUT_BATCHES = 256


def heldout_reads(dataset: GraphDataset, fanouts: Sequence[int], batch_size: int, seed: int,
                  progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Feature reads per node of batches sampled with the seed after a hotness's own.

    Why: what is chosen from a hotness (the hottest rows, for caches or to replicate) must not be
    judged on the same sample. Rows that sample happened to draw often are drawn about as often as any
    other by the next epoch, so the sample over-states its own hottest rows' share of the reads: on
    bench/epoch.py's 8M graph (20,000 training seeds) its top 5% of rows took 54.5% of its reads and
    39.5% of the next epoch's. A fresh sample is what an epoch of training draws."""
    per_epoch = -(-int(np.asarray(dataset.split("train")).size) // int(batch_size))
    return presample(dataset, fanouts, batch_size, num_batches=max(min(per_epoch, HELDOUT_BATCHES), 1),
                     seed=(int(seed) + 1) % SEED_LIMIT, progress=progress).feature_reads
