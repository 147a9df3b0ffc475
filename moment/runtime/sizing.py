"""What a run's memory budget is resolved from: the extent of a mini-batch (sampled for real at start-up),
the sizes torch's objects state for it, and the rank's and torchrun agent's measured fixed costs.

Every rank of a run measures them (`run_inputs`, the ranks agreeing on their maxima) and `moment train`
measures them before any rank starts (`preview_inputs`), so the launcher's budget check and the ranks'
are the same numbers. Sampling needs torch; the rest is arithmetic (moment.runtime.footprint), so a dry run
that reuses a recorded extent and start size loads no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from moment.io.device import DeviceMemory
from moment.placement.opened import Layout
from moment.runtime.budget import process_sizes, under_torchrun
from moment.runtime.config import TrainConfig
from moment.runtime.devices import default_device
from moment.runtime.footprint import (LayerExtent, decoder_bytes, exchange_round_bytes, held_batches,
                                      multilabel_targets, out_dim, remote_reader_bytes, remote_round_bytes,
                                      stated_training_bytes)
from moment.runtime.run_plan import RunInputs, RunPlan, gpu_tier_rows, resolve_run
from moment.runtime.start_sizes import record_path, start_sizes
from moment.workload import batch_bytes
from moment.workload.graph import GraphDataset

if TYPE_CHECKING:
    import torch

    from moment.runtime.dist import DistContext
    from moment.workload.sampler import CSRGraph, SeedBatches

# Imports inside functions: torch (the sampler, a user's model, the ranks' agreement) loads only where a batch is
# sampled or a tensor made, so that a dry run reusing a recorded extent and start size loads none.

BASE_ENV = "MOMENT_RANK_BASE_BYTES"  # set by `moment train`: the per-rank fixed cost its budget check charged
AGENT_ENV = "MOMENT_AGENT_BYTES"  # set by `moment train`: torchrun's agent as its budget check charged it
SHARED_ENV = "MOMENT_SHARED_START_BYTES"  # set by `moment train`: what ranks and agent share, as its check charged it
#: set by `moment train`: the batch extent its check charged (sampled, or recorded), with its `_extent_key`
EXTENT_ENV = "MOMENT_RUN_EXTENT"


@dataclass(frozen=True)
class Extent:
    """The most rows and edges one mini-batch touches, and each layer's block at its largest (input layer
    first): stated from sampled batches (`_batch_extent`)."""

    rows: int
    edges: int
    layers: tuple[LayerExtent, ...]

    def most(self, other: Extent) -> Extent:
        return Extent(max(self.rows, other.rows), max(self.edges, other.edges),
                      tuple(LayerExtent(max(a.src, b.src), max(a.dst, b.dst), max(a.edges, b.edges))
                            for a, b in zip(self.layers, other.layers, strict=True)))


#: batches sampled at start-up to state the extent of a batch (the first of epoch 0)
EXTENT_BATCHES = 8
#: the extent of a batch: the sampled batches' mean plus this many standard deviations of theirs
EXTENT_SPREAD = 5


def _bound(values: Sequence[int]) -> int:
    """The most one batch holds of a quantity, from the sampled batches' values: their mean plus EXTENT_SPREAD
    standard deviations (a batch's rows and edges are sums of many sampled neighbours, near normal: a run
    exceeds it in about one batch of three million), at least the largest seen, plus 64. The spread taken is
    at least a Poisson count's (the square root of the mean), so that a few alike samples do not state none."""
    v = np.asarray(values, np.float64)
    sd = max(float(v.std(ddof=1)) if v.size > 1 else 0.0, float(np.sqrt(v.mean())))
    return int(max(v.max(), np.ceil(v.mean() + EXTENT_SPREAD * sd))) + 64


def _batch_extent(cfg: TrainConfig, graph: CSRGraph, batches: SeedBatches, fanouts: list[int],
                  degrees: np.ndarray | None = None) -> Extent:
    """The most rows and edges one mini-batch touches, and each layer's block at its largest: the first
    EXTENT_BATCHES batches sampled for real, bounded from their spread (`_bound`). A batch that could hold
    more than EXTENT_SAMPLE_SLOTS neighbour slots is not sampled (that would cost as much as the run's own
    batches, for a fan-out of any size) but bounded from the graph's degrees (`degree_extent`)."""
    from moment.runtime.link_task import sampler_for
    from moment.workload.seeds import mix

    degrees = graph.degree_histogram() if degrees is None else degrees
    seeds = _sampled_seeds(cfg, batches.batch_size, graph.num_nodes)
    if sample_slots(seeds, fanouts, degrees) > EXTENT_SAMPLE_SLOTS:
        return degree_extent(seeds, fanouts, degrees)
    sampler = sampler_for(cfg.task, graph, fanouts, cfg.negatives)
    hops = len(fanouts)
    seen: list[list[int]] = []  # per batch: rows, edges, then each layer's src, dst and edges
    for i, seeds_i in enumerate(batches.epoch(0)):
        if i == EXTENT_BATCHES:
            break
        sampler.generator.manual_seed(mix(cfg.seed, 0, 0, i))
        mb = sampler.sample(seeds_i)
        nodes, edges = np.cumsum(mb.num_sampled_nodes).tolist(), np.cumsum([0, *mb.num_sampled_edges]).tolist()
        # layer i of L: the edges of hops 1..L-i, as MiniBatch.blocks() cuts them
        seen.append([mb.num_nodes, int(mb.edge_index.shape[1]),
                     *(v for h in range(hops) for v in (nodes[hops - h], nodes[hops - h - 1], edges[hops - h]))])
    if not seen:
        seen = [[0] * (2 + 3 * hops)]
    b = [_bound(col) for col in zip(*seen, strict=True)]
    return Extent(b[0], b[1], tuple(LayerExtent(*b[2 + 3 * i: 5 + 3 * i]) for i in range(hops)))


#: a batch whose sampling could fill more neighbour slots than this (`sample_slots`) is bounded from the
#: graph's degrees instead of sampled: 32 Mi slots, a few hundred MB of the sampler's index matrices
EXTENT_SAMPLE_SLOTS = 1 << 25


def _sampled_seeds(cfg: TrainConfig, batch_size: int, num_nodes: int) -> int:
    """The most nodes a batch's neighbour sampling starts from: its seeds, or a link batch's endpoints (each
    seed, its positive's source and `negatives` destinations per positive)."""
    per_seed = 2 + cfg.negatives if cfg.task == "link" else 1
    return min(batch_size * per_seed, num_nodes)


def _hop_bounds(seeds: int, fanouts: Sequence[int], degrees: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Per hop, (targets, slots, edges, new nodes) at most. A hop's targets are the nodes the previous hop
    added (the seeds first), distinct and never expanded twice, so each hop's edges are at most its targets'
    largest degrees capped at the fan-out, all hops' at most the graph's edges, and its new nodes at most
    its edges and the nodes not yet in the batch. Slots: the sampler's [targets, fan-out] matrix, whose
    width is the fan-out capped at the largest degree (NeighborSampler.sample_neighbors)."""
    n, top = int(degrees.sum()), degrees.size - 1
    edges_left = int(np.dot(degrees, np.arange(degrees.size, dtype=np.int64)))
    by_degree = degrees[::-1]  # node counts, the largest degree first
    first = np.cumsum(by_degree) - by_degree  # nodes of larger degree than each
    values = np.arange(top, -1, -1, dtype=np.int64)  # the degree of each entry of by_degree
    out, targets, rows = [], min(seeds, n), min(seeds, n)
    for f in fanouts:
        width = min(int(f), top)
        taken = np.clip(targets - first, 0, by_degree)  # the `targets` largest degrees
        edges = min(int(np.dot(taken, np.minimum(values, width))), edges_left)
        new = min(edges, n - rows)
        out.append((targets, targets * width, edges, new))
        edges_left -= edges
        targets, rows = new, rows + new
    return out


def sample_slots(seeds: int, fanouts: Sequence[int], degrees: np.ndarray) -> int:
    """The most neighbour slots sampling one batch of `seeds` fills, over all hops (`_hop_bounds`)."""
    return sum(h[1] for h in _hop_bounds(seeds, fanouts, degrees))


def degree_extent(seeds: int, fanouts: Sequence[int], degrees: np.ndarray) -> Extent:
    """The extent of a batch of `seeds` stated from the graph's degree histogram alone (`_hop_bounds`),
    never less than a sampled batch's: what a batch too large to sample for its size is planned with."""
    hops = _hop_bounds(seeds, fanouts, degrees)
    nodes = np.cumsum([hops[0][0], *(h[3] for h in hops)]).tolist()
    edges = np.cumsum([0, *(h[2] for h in hops)]).tolist()
    L = len(fanouts)
    return Extent(nodes[L], edges[L], tuple(LayerExtent(nodes[L - i], nodes[L - i - 1], edges[L - i])
                                            for i in range(L)))


def run_inputs(cfg: TrainConfig, ds: GraphDataset, graph: CSRGraph, batches: Sequence[SeedBatches],
               fanouts: list[int], process_bytes: int, agent_bytes: int, local_ranks: int, layout: Layout | None, *,
               shared_start_bytes: int = 0, ctx: DistContext | None = None, feature_dim: int | None = None,
               device_memory: DeviceMemory | None = None, device: torch.device | str = "cpu") -> RunInputs:
    """What `resolve_run` is given: the largest extent of `batches` (each rank's, or a preview's of every
    rank; a rank of `moment train` takes the one its launcher charged, EXTENT_ENV), the sizes torch's objects
    state for it (a round of the peer exchange among `local_ranks`, whose
    GPU tiers hold what `layout` gives them, and a training step of the model, included), a rank's and
    torchrun's agent's measured sizes (each one's own pages; `shared_start_bytes`: the pages they share), and
    the dataset's sizes. The layout index is charged once for the machine when every rank reads the copy its
    agent kept (`Layout.keep_index`). With `ctx`, the ranks agree on their maxima first: every rank must resolve
    the same plan (the shared cache is one segment). `feature_dim`: the
    run's features are that wide (float32), not `ds`'s (a run planned on its graph alone). `device_memory`:
    this rank's device's free and total bytes (a CUDA rank), agreed as the least of the ranks'. `device`: where a
    model of the user's own that states no step memory is measured (moment.runtime.model_spec)."""
    index_shared = layout is not None and layout.index_kept
    ext = _given_extent(cfg, ds, batches[0].world_size) if batches else None
    if ext is None:
        degrees = graph.degree_histogram()  # once for every rank's batches
        ext = functools.reduce(Extent.most, [_batch_extent(cfg, graph, b, fanouts, degrees) for b in batches])
    if ctx is not None:
        import torch

        least = [-v for v in device_memory] if device_memory is not None else []  # the max of the negated: the least
        flat = [ext.rows, ext.edges, *(v for x in ext.layers for v in (x.src, x.dst, x.edges)), process_bytes,
                agent_bytes, shared_start_bytes, int(not index_shared), *least]
        agreed = [int(x) for x in ctx.all_reduce(torch.tensor(flat, dtype=torch.float64), op="max").tolist()]
        if device_memory is not None:
            device_memory = DeviceMemory(*(-v for v in agreed[-2:]))
            agreed = agreed[:-2]
        *sizes, process_bytes, agent_bytes, shared_start_bytes, own_index = agreed
        index_shared = not own_index  # one rank reading its own copy: each is charged its own
        ext = Extent(sizes[0], sizes[1], tuple(LayerExtent(*sizes[2 + 3 * i: 5 + 3 * i])
                                               for i in range(len(ext.layers))))
    return _inputs(cfg, ds, ext, max(b.batch_size for b in batches), process_bytes, agent_bytes, local_ranks, layout,
                   feature_dim=feature_dim, device_memory=device_memory, device=device,
                   shared_start_bytes=shared_start_bytes, index_shared=index_shared)


def _inputs(cfg: TrainConfig, ds: GraphDataset, ext: Extent, batch_size: int, process_bytes: int, agent_bytes: int,
            local_ranks: int, layout: Layout | None, *, feature_dim: int | None,
            device_memory: DeviceMemory | None, device: torch.device | str, shared_start_bytes: int,
            index_shared: bool) -> RunInputs:
    """`run_inputs` from a batch extent `ext` and the largest batch's seeds (`batch_size`): arithmetic, torch
    loaded only to measure a model of the user's own."""
    rows = min(ext.rows, ds.num_nodes)
    dim = ds.feature_dim if feature_dim is None else int(feature_dim)
    row_bytes = ds.row_bytes if feature_dim is None else dim * np.dtype(np.float32).itemsize
    labels = batch_size * (1 + cfg.negatives) if cfg.task == "link" else 0  # label edges
    width = out_dim(cfg.task, cfg.model, cfg.hidden, ds.num_classes)
    layers = [LayerExtent(min(x.src, rows), min(x.dst, rows), x.edges) for x in ext.layers]
    float_copy = feature_dim is None and ds.feature_dtype != np.float32
    head = decoder_bytes(labels, layers[-1].dst, width) if labels else 0
    multilabel = multilabel_targets(cfg.task, ds.multilabel)
    targets = batch_size * ds.num_classes if multilabel else 0  # a multi-label batch's float targets
    training = stated_training_bytes(cfg, dim, width, layers, rows=rows, float_copy=float_copy, head_bytes=head)
    note = None
    if training is None:  # a model of the user's own: it states its step, or one is measured
        from moment.runtime.model_spec import training_bytes

        training, note = training_bytes(cfg, dim, width, layers, rows=rows, device=device, float_copy=float_copy,
                                        head_bytes=head, multilabel=multilabel)
    split = layout.split if layout is not None else None
    return RunInputs(train_nodes=int(np.asarray(ds.train_idx).size),
                     graph_bytes=ds.file("indptr").stat().st_size + ds.file("indices").stat().st_size,
                     labels_bytes=ds.file("labels").stat().st_size, rows_max=rows, edges_max=ext.edges,
                     process_bytes=process_bytes, sampler_map_bytes=batch_bytes.map_bytes(ds.num_nodes),
                     batch_ids_bytes=batch_bytes.id_bytes(rows, ext.edges, labels, targets),
                     held_batches=held_batches(cfg.depth),
                     training_bytes=training, training_note=note, agent_bytes=agent_bytes, exchange_bytes=exchange_round_bytes(
                         rows, row_bytes, local_ranks, gpu_tier_rows(layout, local_ranks) if layout else 0),
                     remote_exchange_bytes=remote_round_bytes(rows, row_bytes, len(split.machines)) if split else 0,
                     remote_reader_bytes=remote_reader_bytes(layout.manifest.row.align) if split else 0,
                     device_memory=device_memory, shared_start_bytes=shared_start_bytes, index_shared=index_shared)


def preview_inputs(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, agent: bool = True,
                   layout: Layout | None = None, nnodes: int = 1,
                   feature_dim: int | None = None) -> RunInputs:
    """What rank 0 of an `nproc`-rank run (on each of `nnodes` machines) will measure, measured before any rank
    starts: the largest extent of every rank's batches (the ranks agree on it), a fresh rank's fixed cost
    and, with `agent` (the run is started by torchrun, as `moment train` does), a fresh torchrun agent's.

    The extent recorded for the same graph, seeds and sampling (`_extent_key`) is reused: the sampling is
    deterministic, so the figures are the ones it would sample (and the ranks will), without loading torch
    (with a recorded start size too, `start_sizes`, a dry run without a budget loads none at all). Every
    extent sampled here is recorded."""
    if layout is None and cfg.layout is not None:
        layout = Layout.open(cfg.layout)
    world = nproc * max(nnodes, 1)
    key = _extent_key(cfg, ds, world)
    got = _read_extent(key)
    if got is None:  # sampled while the fresh interpreter, if one was started, measures the start size
        from moment.runtime.link_task import train_seeds
        from moment.workload.sampler import CSRGraph, SeedBatches

        graph, fanouts = CSRGraph.from_dataset(ds, in_memory=False), cfg.resolved_fanouts()
        train_idx = train_seeds(cfg.task, graph, np.asarray(ds.train_idx))
        per_rank = [SeedBatches(train_idx, cfg.resolved_batch_size(train_idx.size, world), seed=cfg.seed, rank=r,
                                world_size=world) for r in range(world)]
        degrees = graph.degree_histogram()
        ext = functools.reduce(Extent.most, [_batch_extent(cfg, graph, b, fanouts, degrees) for b in per_rank])
        got = ext, max(b.batch_size for b in per_rank)
        _write_extent(key, *got)
    agent_bytes, rank_bytes, shared, measured_on = start_sizes(cfg.model)
    inputs = _inputs(cfg, ds, *got, rank_bytes, agent_bytes if agent else 0, nproc, layout,
                     feature_dim=feature_dim, device_memory=None, device="cpu", shared_start_bytes=shared,
                     index_shared=agent)  # `moment train`'s agent keeps the index for its ranks
    return dataclasses.replace(inputs, process_measured_on=measured_on)


#: the modules whose code decides a sampled extent (their text is part of `_extent_key`)
_SAMPLING_CODE = ("runtime/sizing.py", "runtime/link_task.py", "runtime/config.py", "workload/sampler.py",
                  "workload/links.py", "workload/seeds.py")
_EXTENTS_KEPT = 32  # extents recorded at most (the most recent)


def _extent_key(cfg: TrainConfig, ds: GraphDataset, world: int) -> str:
    """What a preview's sampled extent depends on, hashed: the graph and training split (each file's path,
    size, modification time and recorded sha256), the run's sampling options and world size, the sampling
    code, its bounds (EXTENT_*) and the torch that runs it."""
    files = []
    for name in ("indptr", "indices", "train_idx"):
        f = ds.file(name)
        st = f.stat()
        files.append([str(f.resolve()), st.st_size, st.st_mtime_ns, ds.manifest.files[name].sha256])
    root = Path(__file__).resolve().parents[1]  # the moment package (this is moment/runtime/sizing.py)
    code = hashlib.sha256(b"".join((root / m).read_bytes() for m in _SAMPLING_CODE)).hexdigest()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    key = {"files": files, "task": cfg.task, "fanouts": cfg.resolved_fanouts(), "negatives": cfg.negatives,
           "seed": cfg.seed, "batch_size": cfg.batch_size, "world": world, "code": code, "torch": torch_version,
           "numpy": np.__version__, "bounds": [EXTENT_BATCHES, EXTENT_SPREAD, EXTENT_SAMPLE_SLOTS]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _extents_path() -> Path:
    return record_path().with_name("extents.json")  # beside the start sizes' record


def _read_extents() -> dict:
    try:
        got = json.loads(_extents_path().read_text())
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_extent(key: str) -> tuple[Extent, int] | None:
    """The extent and largest batch recorded under `key`, or None (none, or not well formed: sampled again)."""
    return _extent_of(_read_extents().get(key))


def _extent_of(rec: object) -> tuple[Extent, int] | None:
    """An extent and largest batch as recorded (`_extent_record`), or None when `rec` is not one."""
    try:
        rows, edges, layers, batch = rec["rows"], rec["edges"], rec["layers"], rec["batch_size"]
        ext = Extent(int(rows), int(edges), tuple(LayerExtent(*(int(v) for v in x)) for x in layers))
        return ext, int(batch)
    except (KeyError, TypeError, ValueError):
        return None


def _extent_record(ext: Extent, batch_size: int) -> dict:
    return {"rows": ext.rows, "edges": ext.edges, "batch_size": int(batch_size),
            "layers": [[x.src, x.dst, x.edges] for x in ext.layers]}


def _write_extent(key: str, ext: Extent, batch_size: int) -> None:
    """Record a sampled extent (the most recent _EXTENTS_KEPT), renamed into place as the start sizes are; a
    record that cannot be written is no error."""
    path = _extents_path()
    kept = {k: v for k, v in _read_extents().items() if k != key}
    kept = dict(list(kept.items())[-(_EXTENTS_KEPT - 1):])
    kept[key] = _extent_record(ext, batch_size)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def planned_inputs(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, feature_dim: int, gpu_rows: int) -> RunInputs:
    """`preview_inputs` of a run whose features and layout are not written yet (`run_plan.planned_minimum`):
    the batch extent sampled on `ds`'s graph (any dataset with the run's graph: bench/epoch.py synthesizes
    the graph with one-wide features first), the model's step and a round of the peer exchange for
    `feature_dim`-wide float32 rows, `gpu_rows` held by each rank."""
    got = preview_inputs(cfg, ds, nproc, feature_dim=feature_dim)
    rb = feature_dim * np.dtype(np.float32).itemsize
    return dataclasses.replace(got, exchange_bytes=exchange_round_bytes(got.rows_max, rb, nproc, gpu_rows))


def preview_plan(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, layout: Layout | None = None,
                 agent: bool = True, pack_index_bytes: int | None = None, inputs: RunInputs | None = None,
                 nnodes: int = 1) -> RunPlan:
    """The run plan the ranks of an `nproc`-rank run on this machine (one of `nnodes`) will resolve, before any
    starts.

    `pack_index_bytes`: charge the index of a pack not written yet (`moment data pack`); `inputs`: reuse a
    measurement (`preview_inputs`) when previewing several budgets or packs of one run."""
    layout = layout or Layout.open(cfg.layout)
    inputs = inputs or preview_inputs(cfg, ds, nproc, agent=agent, layout=layout, nnodes=nnodes)
    return resolve_run(cfg, layout, world_size=nproc * max(nnodes, 1), local_world_size=nproc, inputs=inputs,
                       device=default_device(cfg.device), pack_index_bytes=pack_index_bytes)


def extent_env(cfg: TrainConfig, ds: GraphDataset, world: int) -> dict[str, str]:
    """The batch extent a launcher's check charged (`preview_inputs` recorded it), to hand its ranks in their
    environment: a rank whose graph, split, sampling options, world size and code give the same key takes it
    instead of sampling its first batches again (`run_inputs`), and charges what the check charged. Empty when
    none was recorded (the ranks sample, as they agree on the same figures anyway)."""
    key = _extent_key(cfg, ds, world)
    got = _read_extent(key)
    return {} if got is None else {EXTENT_ENV: json.dumps({"key": key, **_extent_record(*got)})}


def _given_extent(cfg: TrainConfig, ds: GraphDataset, world: int) -> Extent | None:
    """The extent `moment train`'s launcher handed this rank (EXTENT_ENV) when it is this run's: its key is the
    one this rank's graph, options and code give; else None."""
    raw = os.environ.get(EXTENT_ENV, "")
    try:
        rec = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("key") != _extent_key(cfg, ds, world):
        return None
    got = _extent_of(rec)
    return None if got is None else got[0]


def start_env(model: str | None = None) -> dict[str, str]:
    """The start-up figures a launcher's budget check charged (`preview_plan`, for a run of `model`), to hand its
    ranks in their environment: they charge the same, so the minimum the check names is the one they accept."""
    agent, rank, shared, _ = start_sizes(model)
    return {BASE_ENV: str(rank), AGENT_ENV: str(agent), SHARED_ENV: str(shared)}


def rank_start_sizes(kept_bytes: int = 0) -> tuple[int, int, int]:
    """(a rank's own start-up memory, torchrun's agent's (0 without torchrun), the pages they share, charged
    once) as the budget charges them: the launcher's preview figures when `moment train` started this rank (so
    that the launcher's check and the ranks' are the same numbers, and the minimum it names is accepted), else
    what this rank and its agent (its parent) each hold alone now, and the most either shares (their libraries,
    and what a rank forked from the agent has not written, less `kept_bytes`: the layout index the agent kept
    for its ranks, which the budget charges as the index): one read of each."""
    given = {k: int(v) for k in (BASE_ENV, AGENT_ENV, SHARED_ENV) if (v := os.environ.get(k, "")).isdigit()}
    torchrun = under_torchrun()
    if len(given) < 3:  # measured only where the launcher gave nothing
        own, shared = process_sizes()
        agent, agent_shared = process_sizes(os.getppid()) if torchrun else (0, 0)
        given = {BASE_ENV: own, AGENT_ENV: agent, SHARED_ENV: max(0, max(shared, agent_shared) - kept_bytes)} | given
    return given[BASE_ENV], given[AGENT_ENV] if torchrun else 0, given[SHARED_ENV]
