"""Seeded synthetic graphs that look like the real ones where it matters: skew, homophily, scale.

Why: placement and caching only pay off on skewed access, and the training runtime needs labels a GNN
can learn (and an MLP alone cannot), so the generator is a degree-corrected stochastic block model:

* **Communities = classes.** Each node gets a class uniformly at random.
* **Power-law popularity (Chung–Lu).** Inside its class, node j (by a random popularity rank) has weight
  w_j ∝ (j + 1)^-β with β = 1 / (γ - 1), γ the degree exponent (default 2.3, like web/citation graphs).
  Row u gets Poisson(avg_degree · N · w_u / Σw) neighbours, each drawn with probability ∝ weight, so
  both the row lengths and how often a node appears in other rows follow the same power law.
* **Homophily.** A neighbour is drawn from u's own class with probability `homophily`, else from a
  uniformly chosen other class (then ∝ weight inside it).
* **Features** = class centroid + Gaussian noise, scaled to unit variance; `snr` sets how separable one
  node's features are (default 1.0 on 50k nodes, 16 classes: an MLP reaches ~25% accuracy, an MLP on
  [x, 1-hop mean, 2-hop mean] ~89%).

The inverse CDF of the power law is closed-form, so every neighbour costs O(1) vectorised work.
Rows are generated in fixed chunks sorted by source, deduplicated (no multi-edges, no self-loops) and
streamed to disk, so memory stays bounded (a few hundred MB) from thousands to tens of millions of nodes.
Each chunk has its own RNG stream ([seed, stream, chunk]), so the output depends only on the arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError
from moment.workload.import_options import MIN_TRAIN
from moment.workload.seeds import check_seed
from moment.workload.graph import GraphDataset, GraphWriter, index_dtype, label_dtype

CHUNK_ROWS = 1 << 17  # fixed: the output must not depend on memory or core count
Progress = Callable[[int, int], None]


def split_sizes(
    num_nodes: int, train_fraction: float, val_fraction: float, test_fraction: float, min_train: int = MIN_TRAIN
) -> tuple[int, int, int]:
    """Split sizes that follow the shares: each share's whole nodes, the nodes rounding leaves given to the
    largest remainders (train first of equal ones), so that shares summing to 1 take every node whatever N (each
    rounded up on its own, 0.6,0.2,0.2 of 2,708 nodes needed 2,709). With `min_train` (the default shares'), a
    small graph still gets that many training nodes, and a quarter of it for val and for test."""
    n = num_nodes
    exact = [f * n for f in (train_fraction, val_fraction, test_fraction)]
    sizes = [math.floor(round(x, 6)) for x in exact]  # (0.1 * 100 is 10.000000000000002)
    left = min(n, math.floor(round(sum(exact), 6))) - sum(sizes)
    for i in sorted(range(3), key=lambda i: (sizes[i] - exact[i], i))[: max(0, left)]:
        sizes[i] += 1
    sizes = [max(1, k) for k in sizes]  # a split of no node would not train, validate or test
    if min_train:
        sizes = [max(sizes[0], min(min_train, n // 2)), *(max(k, min(min_train // 4, n // 8)) for k in sizes[1:])]
    tr, va, te = sizes
    if tr + va + te > n:
        raise MomentError(
            f"splits need {tr}+{va}+{te} nodes but the graph has {n}", hint="use more nodes or smaller fractions"
        )
    return tr, va, te


class _PowerLaw:
    """Inverse-CDF sampler for the in-class popularity rank j in [0, n) with density ∝ (x + 1)^-β."""

    def __init__(self, beta: float):
        self.a = 1.0 - beta  # in (0, 1)

    def cdf_top(self, n: np.ndarray) -> np.ndarray:
        return (np.asarray(n, dtype=np.float64) + 1.0) ** self.a - 1.0

    def weight(self, j: np.ndarray) -> np.ndarray:
        """Probability mass of rank j up to the class normaliser (∫_j^{j+1} (x+1)^-β dx · a)."""
        j = np.asarray(j, dtype=np.float64)
        return (j + 2.0) ** self.a - (j + 1.0) ** self.a

    def sample(self, u: np.ndarray, n: np.ndarray) -> np.ndarray:
        x = (1.0 + u * self.cdf_top(n)) ** (1.0 / self.a) - 1.0
        j = x.astype(np.int64)
        return np.minimum(j, np.asarray(n, dtype=np.int64) - 1)


def synthesize(
    out_dir: str | Path,
    num_nodes: int,
    feature_dim: int = 128,
    avg_degree: float = 15.0,
    num_classes: int = 16,
    seed: int = 0,
    dtype: str = "float32",
    *,
    homophily: float = 0.75,
    power_law: float = 2.3,
    snr: float = 1.0,
    train_fraction: float = 0.01,
    val_fraction: float = 0.005,
    test_fraction: float = 0.005,
    min_train: int = MIN_TRAIN,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Generates a dataset into `out_dir` (crash-safe, see `GraphWriter`) and returns it opened.

    `progress(done_rows, num_nodes)` is called after every chunk. Splits are disjoint random node
    sets: `train_fraction` of the nodes (at least `min_train`), `val_fraction`, `test_fraction`.
    """
    _check_args(num_nodes, feature_dim, avg_degree, num_classes, dtype, homophily, power_law, snr)
    check_seed(seed)
    for what, f in (("--train-fraction", train_fraction), ("validation fraction", val_fraction),
                    ("test fraction", test_fraction)):
        if not (0 < f <= 1):
            raise MomentError(f"{what} must be in (0, 1] (got {f})",
                              hint="training and evaluation need nodes; e.g. 0.01 for 1% of the nodes")
    n, c = int(num_nodes), int(num_classes)
    sizes = split_sizes(n, train_fraction, val_fraction, test_fraction, min_train)
    source: dict[str, Any] = {
        "generator": "moment.synth/dcsbm-chung-lu",
        "seed": seed,
        "avg_degree_target": avg_degree,
        "homophily_target": homophily,
        "power_law": power_law,
        "snr": snr,
        "splits": {"train": sizes[0], "val": sizes[1], "test": sizes[2]},
    }
    with GraphWriter(out_dir, overwrite=overwrite, name=Path(out_dir).name) as w:
        w.reserve("features", n * int(feature_dim) * np.dtype(dtype).itemsize)  # before the model's centroids
        m = _Model.draw(n, int(feature_dim), avg_degree, c, seed, np.dtype(dtype), homophily, power_law, snr)
        total, same = _write_rows(w, m, progress)
        if total == 0:
            raise MomentError(f"the generated graph has no edges (--avg-degree {avg_degree} on {n} nodes)",
                              hint="raise --avg-degree")
        w.write_array("labels", m.labels)
        srng = np.random.default_rng([seed, 3])
        pick = srng.choice(n, size=sum(sizes), replace=False)
        a, b = sizes[0], sizes[0] + sizes[1]
        for name, part in (("train_idx", pick[:a]), ("val_idx", pick[a:b]), ("test_idx", pick[b:])):
            w.write_array(name, np.sort(part).astype(np.int64))
        source["avg_degree"] = total / n
        source["homophily"] = same / total if total else 0.0
        return w.commit(num_classes=c, source=source, validate=False)


@dataclass
class _Model:
    """The graph's global structure (classes, popularity ranks, a class-major member table: all O(N)), from
    which each chunk of rows is drawn on its own (its own generator: chunks can be made in any order)."""

    n: int
    d: int
    seed: int
    dtype: np.dtype
    homophily: float
    law: _PowerLaw
    labels: np.ndarray
    members: np.ndarray  # class-major, most popular first
    cls_count: np.ndarray
    cls_start: np.ndarray
    lam: np.ndarray  # expected row length of each node
    centroids: np.ndarray
    sigma: float
    scale: np.float32

    @classmethod
    def draw(cls, n: int, d: int, avg_degree: float, c: int, seed: int, dtype: np.dtype, homophily: float,
             power_law: float, snr: float) -> _Model:
        law = _PowerLaw(1.0 / (power_law - 1.0))
        rng = np.random.default_rng([seed, 0])
        labels = rng.integers(0, c, size=n).astype(label_dtype(c))
        order = rng.permutation(n)  # popularity rank -> node
        by_class = np.argsort(labels[order], kind="stable")
        members = order[by_class].astype(index_dtype(n))
        del order, by_class
        cls_count = np.bincount(labels, minlength=c).astype(np.int64)
        cls_start = np.concatenate([[0], np.cumsum(cls_count)[:-1]]).astype(np.int64)
        rank = np.empty(n, dtype=np.int64)
        rank[members] = np.arange(n, dtype=np.int64) - np.repeat(cls_start, cls_count)
        weight = law.weight(rank) / law.cdf_top(cls_count)[labels]  # in-class probability of each node
        lam = weight * (avg_degree * n / weight.sum())
        del rank, weight
        centroids = rng.standard_normal((c, d)).astype(np.float32)
        sigma = math.sqrt(2.0 * d) / (2.0 * snr)
        scale = np.float32(1.0 / math.sqrt(1.0 + sigma * sigma))
        return cls(n, d, seed, dtype, homophily, law, labels, members, cls_count, cls_start, lam, centroids,
                   sigma, scale)

    def features(self, chunk: int, lo: int, hi: int) -> np.ndarray:
        r = np.random.default_rng([self.seed, 2, chunk])
        x = r.standard_normal((hi - lo, self.d), dtype=np.float32)
        x *= np.float32(self.sigma)
        x += self.centroids[self.labels[lo:hi]]
        x *= self.scale
        return x.astype(self.dtype, copy=False)

    def edges(self, chunk: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows lo..hi: each row's length and the neighbours, sorted, without self-loops or multi-edges."""
        n, c = self.n, len(self.cls_count)
        r = np.random.default_rng([self.seed, 1, chunk])
        deg = r.poisson(self.lam[lo:hi])
        src = np.repeat(np.arange(lo, hi, dtype=np.int64), deg)
        own = self.labels[src].astype(np.int64)
        if c > 1:
            other = (own + 1 + r.integers(0, c - 1, size=src.size)) % c
            cls = np.where(r.random(src.size) < self.homophily, own, other)
        else:
            cls = own
        j = self.law.sample(r.random(src.size), self.cls_count[cls])
        dst = self.members[self.cls_start[cls] + j].astype(np.int64)
        keep = dst != src
        key = (src[keep] - lo) * n + dst[keep]
        key.sort()  # by row, then neighbour (np.unique's hash path is far slower here)
        if key.size:
            key = key[np.concatenate([[True], key[1:] != key[:-1]])]  # no multi-edges
        rows = key // n
        counts = np.bincount(rows, minlength=hi - lo)
        return counts, (key - rows * n).astype(index_dtype(n))


def _write_rows(w: GraphWriter, m: _Model, progress: Progress | None) -> tuple[int, int]:
    """Stream the CSR and the features, chunk by chunk; returns (edges, edges within a class)."""
    n = m.n
    ip = w.stream("indptr", np.int64, (), rows=n + 1)
    ix = w.stream("indices", index_dtype(n), ())
    fx = w.stream("features", m.dtype, (m.d,), rows=n)
    ip.write(np.zeros(1, dtype=np.int64))
    total = same = 0
    bounds = [(k, lo, min(lo + CHUNK_ROWS, n)) for k, lo in enumerate(range(0, n, CHUNK_ROWS))]
    # Features (the big array) are made on a second thread; numpy's RNG and arithmetic release the GIL.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(m.features, *bounds[0])
        for i, (k, lo, hi) in enumerate(bounds):
            counts, nbrs = m.edges(k, lo, hi)
            nxt = pool.submit(m.features, *bounds[i + 1]) if i + 1 < len(bounds) else None
            ip.write(total + np.cumsum(counts))
            total += int(nbrs.size)
            rows = np.repeat(np.arange(lo, hi), counts)
            same += int(np.count_nonzero(m.labels[rows] == m.labels[nbrs]))
            ix.write(nbrs)
            fx.write(pending.result())
            pending = nxt
            if progress is not None:
                progress(hi, n)
    if total:
        for name in ("indptr", "indices", "features"):
            w.finish(name)
    return total, same


def _check_args(
    n: int, d: int, avg_degree: float, c: int, dtype: str, homophily: float, power_law: float, snr: float
) -> None:
    if n < 2:
        raise MomentError(f"--nodes must be at least 2 (got {n})")
    if n >= 2**40:
        raise MomentError(f"--nodes {n} is beyond what the generator supports (2**40)")
    if d < 1:
        raise MomentError(f"--feature-dim must be positive (got {d})")
    if not (0 < avg_degree <= 10_000):
        raise MomentError(f"--avg-degree must be in (0, 10000] (got {avg_degree})",
                          hint="a GNN aggregates over edges: an edgeless graph has nothing to sample")
    if not (1 <= c < 2**15):
        raise MomentError(f"--classes must be in [1, 32767] (got {c})")
    if c > n:
        raise MomentError(f"--classes {c} exceeds --nodes {n}")
    if dtype not in ("float32", "float16"):
        raise MomentError(f"--dtype must be float32 or float16 (got {dtype!r})")
    if not (0.0 <= homophily <= 1.0):
        raise MomentError(f"--homophily must be in [0, 1] (got {homophily})")
    if not (2.0 < power_law < math.inf):
        raise MomentError(f"--power-law must be a finite exponent > 2 (got {power_law})",
                          hint="2.1-3 is typical of real graphs")
    if not (snr > 0):
        raise MomentError(f"snr must be positive (got {snr})")
