"""Link prediction: batches of label edges from seed nodes (moment.workload.links) against the CSR, and the
decoder, loss, metric and sizes of moment.runtime.link_task; a small model learns links end to end."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
import torch
from test_sampler import check_batch, csr

from moment.errors import MomentError
from moment.runtime.link_task import (decoder_bytes, link_accuracy, link_logits, link_loss, out_dim,
                                      roc_auc)
from moment.runtime.models import SAGE, LayerExtent, step_bytes
from moment.workload.links import LinkNeighborSampler, split_edges, with_in_edges
from moment.workload.sampler import CSRGraph, MiniBatch, NeighborSampler, SeedBatches
from moment.workload.seeds import mix


def random_rows(n: int, max_deg: int, seed: int, isolated: float = 0.2) -> list[list[int]]:
    r = np.random.default_rng(seed)
    return [[] if r.random() < isolated else sorted(r.choice(n, r.integers(1, max_deg + 1), replace=False).tolist())
            for _ in range(n)]


def link_batch(rows: list[list[int]], seeds: list[int], negatives: int = 1, seed: int = 7,
               fanouts: tuple[int, ...] = (3, 2)) -> MiniBatch:
    s = LinkNeighborSampler(csr(rows), fanouts, negatives=negatives)
    s.generator.manual_seed(seed)
    return s.sample(seeds)


def label_edges(mb: MiniBatch) -> tuple[list[int], list[int]]:
    """The label edges in global ids, through n_id."""
    src, dst = mb.n_id[mb.edge_label_index].tolist()
    return src, dst


@pytest.mark.parametrize("negatives", [0, 1, 3])
def test_a_link_batch_is_laid_out_as_stated(negatives):
    rows = random_rows(40, 6, seed=negatives)
    seeds = list(range(0, 40, 2))
    mb = link_batch(rows, seeds, negatives)
    linked = [v for v in seeds if rows[v]]
    p = len(linked)
    assert mb.edge_label_index.dtype == torch.int64 and mb.edge_label.dtype == torch.float32
    assert mb.edge_label_index.shape == (2, p * (1 + negatives))
    assert mb.edge_label.tolist() == [1.0] * p + [0.0] * (p * negatives)  # positives first
    src, dst = label_edges(mb)
    # one positive per seed with an in-neighbour, in seed order, and each is a real edge u -> v (u in row v)
    assert dst[:p] == linked
    assert all(u in rows[v] for u, v in zip(src[:p], dst[:p], strict=True))
    # negative j of positive i at p + i * negatives + j keeps the positive's source
    assert src[p:] == [u for u in src[:p] for _ in range(negatives)]
    assert all(0 <= w < len(rows) for w in dst[p:])
    # the batch's seeds are the endpoints, de-duplicated in order of first appearance, sources first
    ends = list(dict.fromkeys(src + dst))
    assert mb.seeds.tolist() == ends and mb.batch_size == len(ends)
    assert int(mb.edge_label_index.max()) < mb.batch_size
    check_batch(rows, ends, [3, 2], mb)  # neighbour-sampled exactly as node seeds are


def test_the_neighbourhood_is_the_node_samplers_after_the_label_draws():
    """The same code and the same generator: after the positive and negative draws, the neighbour sampler
    continues the stream, so the batch equals NeighborSampler's of the endpoints from that state."""
    rows = random_rows(60, 8, seed=1)
    g = csr(rows)
    link = LinkNeighborSampler(g, (4, 3), negatives=2)
    link.generator.manual_seed(11)
    src, dst = link.positives(range(30))
    w = torch.randint(g.num_nodes, (2 * src.numel(),), generator=link.generator)
    ends = torch.cat([src, src.repeat_interleave(2), dst, w])
    ends = torch.tensor(list(dict.fromkeys(ends.tolist())))
    node = NeighborSampler(g, (4, 3))
    node.generator.set_state(link.generator.get_state())
    want = node.sample(ends)
    link.generator.manual_seed(11)
    got = link.sample(range(30))
    assert torch.equal(got.n_id, want.n_id) and torch.equal(got.edge_index, want.edge_index)
    assert got.num_sampled_nodes == want.num_sampled_nodes


def test_positives_are_uniform_over_the_in_neighbours():
    rows = [[], [0, 2, 5, 7], [], [], [], [], [], [], [1]]
    s = LinkNeighborSampler(csr(rows), (2,))
    s.generator.manual_seed(3)
    src, dst = s.positives(torch.full((40_000,), 1))
    assert set(dst.tolist()) == {1}
    counts = torch.bincount(src, minlength=9)[[0, 2, 5, 7]].double()
    chi2 = float(((counts - 10_000) ** 2 / 10_000).sum())
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom, p = 0.001
    assert int(counts.sum()) == 40_000


def test_negatives_are_uniform_over_all_nodes():
    n = 50
    s = LinkNeighborSampler(csr(random_rows(n, 4, seed=2, isolated=0.0)), (1,), negatives=100)
    s.generator.manual_seed(5)
    mb = s.sample(range(n))
    w = mb.n_id[mb.edge_label_index[1, n:]]
    counts = torch.bincount(w, minlength=n).double()
    chi2 = float(((counts - 100) ** 2 / 100).sum())
    assert chi2 < 86.7  # chi-square, 49 degrees of freedom, p = 0.001: a skewed or partial range fails


def test_a_batch_is_a_function_of_its_seeds_and_generator_seed():
    rows = random_rows(80, 6, seed=4)
    seeds = list(range(5, 80, 3))
    a, b = link_batch(rows, seeds, 2, seed=mix(0, 1, 2)), link_batch(rows, seeds, 2, seed=mix(0, 1, 2))
    for f in ("n_id", "edge_index", "edge_label_index", "edge_label"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    c = link_batch(rows, seeds, 2, seed=mix(0, 1, 3))
    assert label_edges(c) != label_edges(a)


def test_seeds_without_in_neighbours_give_no_positive_and_an_all_isolated_batch_is_empty():
    rows = [[1], [], [0, 1], []]
    mb = link_batch(rows, [1, 2, 3, 0], negatives=1)
    src, dst = label_edges(mb)
    assert dst[:2] == [2, 0] and mb.edge_label.tolist() == [1, 1, 0, 0]
    empty = link_batch(rows, [1, 3], negatives=2)
    assert empty.n_id.numel() == 0 and empty.batch_size == 0
    assert empty.edge_label_index.shape == (2, 0) and empty.edge_label.shape == (0,)
    assert [b.num_dst for b in empty.blocks()] == [0, 0]
    assert with_in_edges(csr(rows), [3, 2, 1, 0]).tolist() == [2, 0]
    # its loss is 0 and still has a backward (a DDP rank must run one), its accuracy undefined
    h = torch.zeros((0, 4), requires_grad=True)
    loss = link_loss(link_logits(h, empty.edge_label_index), empty.edge_label)
    loss.backward()
    assert loss.item() == 0.0 and h.grad is not None
    assert np.isnan(link_accuracy(link_logits(h, empty.edge_label_index), empty.edge_label))


def test_bad_arguments_are_refused():
    g = csr([[1], [0]])
    with pytest.raises(ValueError, match="negatives"):
        LinkNeighborSampler(g, (2,), negatives=-1)
    s = LinkNeighborSampler(g, (2,))
    with pytest.raises(ValueError, match="seed ids out of range"):
        s.sample([2])
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        s.sample_edges([0, 1], [1])
    with pytest.raises(ValueError, match="destination ids out of range"):
        s.sample_edges([0], [5])


def test_given_edges_are_sampled_with_negatives():
    rows = random_rows(30, 5, seed=6)
    s = LinkNeighborSampler(csr(rows), (2, 2), negatives=2)
    s.generator.manual_seed(1)
    mb = s.sample_edges([3, 4, 3], [9, 9, 1])
    src, dst = label_edges(mb)
    assert src[:3] == [3, 4, 3] and dst[:3] == [9, 9, 1] and src[3:] == [3, 3, 4, 4, 3, 3]
    assert mb.edge_label.tolist() == [1.0] * 3 + [0.0] * 6


def test_split_edges_holds_out_real_edges_and_removes_them():
    rows = random_rows(50, 6, seed=8, isolated=0.0)
    edges = {(u, v) for v, r in enumerate(rows) for u in r}
    rest, held = split_edges(csr(rows), 0.25, seed=1)
    held_set = set(zip(*held.tolist(), strict=True))
    kept = {(u, v) for v in range(50) for u in rest.indices[rest.indptr[v]:rest.indptr[v + 1]].tolist()}
    assert held.shape[1] == round(0.25 * len(edges)) == len(held_set)
    assert held_set <= edges and kept == edges - held_set
    assert torch.equal(split_edges(csr(rows), 0.25, seed=1)[1], held)
    assert split_edges(csr(rows), 0.0)[1].shape == (2, 0)
    with pytest.raises(ValueError, match="fraction"):
        split_edges(csr(rows), 1.0)


def test_split_edges_of_an_undirected_graph_removes_both_directions():
    r = np.random.default_rng(9)
    pairs = {tuple(sorted(p)) for p in r.integers(0, 40, (120, 2)).tolist() if p[0] != p[1]}
    rows: list[list[int]] = [[] for _ in range(40)]
    for u, v in pairs:
        rows[v].append(u)
        rows[u].append(v)
    rows = [sorted(x) for x in rows]
    rest, held = split_edges(csr(rows), 0.3, seed=2, undirected=True)
    src, dst = held.tolist()
    assert all(u < v for u, v in zip(src, dst, strict=True)) and len(src) == round(0.3 * len(pairs))
    kept = {(u, v) for v in range(40) for u in rest.indices[rest.indptr[v]:rest.indptr[v + 1]].tolist()}
    for u, v in zip(src, dst, strict=True):
        assert (u, v) not in kept and (v, u) not in kept
    assert len(kept) == 2 * (len(pairs) - len(src))


def brute_auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in product(pos, neg)) / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_is_exact_with_ties(seed):
    r = np.random.default_rng(seed)
    n = int(r.integers(2, 200))
    scores = r.integers(0, 6, n).astype(float) if seed % 2 else r.normal(size=n)  # many ties / none
    labels = r.integers(0, 2, n)
    labels[:2] = [0, 1]
    got = roc_auc(torch.tensor(scores), torch.tensor(labels))
    assert got == pytest.approx(brute_auc(scores.tolist(), labels.tolist()), abs=1e-12)


def test_roc_auc_bounds_and_refusals():
    y = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), y) == 1.0
    assert roc_auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), y) == 0.0
    assert roc_auc(torch.zeros(4), y) == 0.5
    with pytest.raises(ValueError, match="positive and negative"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        roc_auc(torch.tensor([float("nan"), 0.2]), torch.tensor([0.0, 1.0]))


def test_logits_loss_and_accuracy():
    h = torch.tensor([[1.0, 0.0], [2.0, 1.0], [-1.0, 3.0]], requires_grad=True)
    eli = torch.tensor([[0, 1, 2], [1, 2, 0]])
    logits = link_logits(h, eli)
    assert logits.tolist() == [2.0, 1.0, -1.0]
    label = torch.tensor([1.0, 0.0, 0.0])
    loss = link_loss(logits, label)
    want = -(np.log(1 / (1 + np.exp(-2.0))) + np.log(1 - 1 / (1 + np.exp(-1.0))) + np.log(1 - 1 / (1 + np.exp(1.0)))) / 3
    assert loss.item() == pytest.approx(want)
    loss.backward()
    assert torch.isfinite(h.grad).all()
    assert link_accuracy(logits, label) == pytest.approx(2 / 3)
    assert torch.isfinite(link_loss(torch.tensor([1e4, -1e4]), torch.tensor([0.0, 1.0])))


def test_out_dim_and_what_a_link_step_is_charged():
    assert out_dim("node", "sage", 64, 7) == 7
    assert out_dim("link", "sage", 64, 7) == 64
    assert out_dim("link", "sage", None, 7) == 256 and out_dim("link", "gat", None, 7) == 64
    with pytest.raises(MomentError, match="--task 'edge'"):
        out_dim("edge", "sage", 64, 7)
    layers = [LayerExtent(8000, 1500, 9000), LayerExtent(1500, 1000, 1600)]
    plain = step_bytes("sage", 16, 512, 512, layers, rows=8000, float_copy=False)
    # many label edges over wide embeddings: the decoder, not a layer, holds the most
    head = decoder_bytes(16_384, 1000, 512)
    assert step_bytes("sage", 16, 512, 512, layers, rows=8000, float_copy=False, head_bytes=head) > plain + head // 2
    assert step_bytes("sage", 16, 512, 512, layers, rows=8000, float_copy=False, head_bytes=1) == plain
    assert MiniBatch.id_bytes(10, 20, 6) == MiniBatch.id_bytes(10, 20) + 6 * (2 * 8 + 4)
    assert LinkNeighborSampler.map_bytes(1000) == NeighborSampler.map_bytes(1000)


def sbm(n: int = 600, k: int = 6, deg: int = 8, p_in: float = 0.9, dim: int = 16, snr: float = 0.5,
        seed: int = 0) -> tuple[CSRGraph, torch.Tensor]:
    """A stochastic block model: k communities, in-neighbours mostly from one's own; features = the
    community's centroid (times `snr`) plus unit noise."""
    r = np.random.default_rng(seed)
    comm = r.integers(0, k, n)
    members = [np.flatnonzero(comm == c) for c in range(k)]
    rows = []
    for v in range(n):
        d = int(r.poisson(deg))
        cs = np.where(r.random(d) < p_in, comm[v], r.integers(0, k, d))
        nb = np.unique(np.array([r.choice(members[c]) for c in cs], dtype=np.int64))
        rows.append(nb[nb != v])
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in rows])])
    x = r.normal(size=(k, dim))[comm] * snr + r.normal(size=(n, dim))
    return CSRGraph.from_arrays(indptr, np.concatenate(rows)), torch.tensor(x, dtype=torch.float32)


def test_a_sage_model_learns_held_out_links():
    """Seed batches as the pipeline makes them, a SAGE model `hidden` wide trained with link_loss: held-out
    edges (absent from the graph it samples) score well above random non-edges."""
    torch.manual_seed(0)
    graph, x = sbm()
    train_graph, held = split_edges(graph, 0.1, seed=0)
    hidden = 32
    model = SAGE(x.shape[1], hidden, out_dim("link", "sage", hidden, 6), num_layers=2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = LinkNeighborSampler(train_graph, (10, 10), negatives=1)

    def held_out_auc() -> float:
        model.eval()
        sampler.generator.manual_seed(123)
        mb = sampler.sample_edges(held[0], held[1])
        with torch.no_grad():
            h = model(x[mb.n_id], mb.blocks())
        model.train()
        return roc_auc(link_logits(h, mb.edge_label_index), mb.edge_label)

    before = held_out_auc()
    batches = SeedBatches(with_in_edges(train_graph, torch.arange(graph.num_nodes)), 64, seed=0)
    losses = []
    for epoch in range(3):
        for i, seeds in enumerate(batches.epoch(epoch)):
            sampler.generator.manual_seed(mix(0, epoch, i))
            mb = sampler.sample(seeds)
            loss = link_loss(link_logits(model(x[mb.n_id], mb.blocks()), mb.edge_label_index), mb.edge_label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    after = held_out_auc()
    assert all(np.isfinite(losses)) and len(losses) >= 27
    assert after > 0.75 and after > before + 0.1, (before, after)
