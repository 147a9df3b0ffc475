"""Each node's predicted class written under the graph's own ids and class names (`run.write_predictions`,
`moment train --predict`). One rank in this process, on the in-memory baseline: the scores are a function of
the node number, so every line of the file is known."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import moment
from moment.errors import MomentError
from moment.runtime.config import TrainConfig
from moment.workload.importers import import_edgelist

N, C = 300, 3
RNG = np.random.default_rng(5)
OWN = np.array([f"acct,{i:04d}" for i in RNG.permutation(N)])  # names with a comma: quoted in the CSV
NAMES = np.array(["fraud", "licit", "unknown"])


def _dataset(tmp: Path) -> Path:
    pairs = RNG.integers(0, N, (3 * N, 2))
    (tmp / "e.csv").write_text("".join(f'"{OWN[a]}","{OWN[b]}"\n' for a, b in pairs))
    (tmp / "nodes.csv").write_text("".join(f'"{OWN[i]}",{i % 7},1.5\n' for i in range(N)))
    (tmp / "labels.csv").write_text("".join(f'"{OWN[i]}",{NAMES[i % 3]}\n' for i in range(N)))
    import_edgelist(tmp / "e.csv", tmp / "ds", node_table=tmp / "nodes.csv", label_table=tmp / "labels.csv")
    return tmp / "ds"


def _scores(batch) -> torch.Tensor:
    """The seeds' logits: class (node % 3) scores 2, the others 0."""
    n = batch.n_id[: batch.batch_size]
    return 2.0 * torch.nn.functional.one_hot(n % C, C).float()


def test_every_node_once_in_order_under_its_own_id_and_class_name(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        got = run.write_predictions(tmp_path / "p.csv", _scores)
        test = np.asarray(run.dataset.test_idx)
        run.write_predictions(tmp_path / "t.csv", _scores, nodes=test)
        run.write_predictions(tmp_path / "s.csv", _scores, nodes="test", epoch=1)  # the split's own loader
        names, own = run.dataset.class_names, run.dataset.node_ids
    assert got == {"path": str(tmp_path / "p.csv"), "nodes": N, "multilabel": False}
    rows = list(csv.reader((tmp_path / "p.csv").open()))
    assert rows[0] == ["node", "id", "class", "probability"] and len(rows) == N + 1
    p = float(np.exp(2) / (np.exp(2) + 2))
    for i, (node, own_id, cls, prob) in enumerate(rows[1:]):
        assert (int(node), own_id, cls) == (i, own[i], names[i % C]) and float(prob) == pytest.approx(p, rel=1e-5)
    assert [int(r[0]) for r in list(csv.reader((tmp_path / "t.csv").open()))[1:]] == test.tolist()
    assert (tmp_path / "s.csv").read_text() == (tmp_path / "t.csv").read_text()


def test_a_scores_function_of_another_shape_is_named(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"write_predictions: scores\(batch\) gave \[64\], expected the seeds' "
                                              r"logits \[64, classes\]"):
            run.write_predictions(tmp_path / "p.csv", lambda b: b.n_id[: b.batch_size].float())
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("options, words", [
    ({"predict": "p.csv", "task": "link"}, "--predict writes each node's class, which --task link does not train"),
    ({"predict": "p.csv", "data_only": True}, "--predict writes each node's class, which --data-only does not"),
    ({"predict_nodes": "test"}, "--predict-nodes test names the nodes --predict writes: give --predict FILE"),
    ({"embed": "e.npy", "data_only": True}, "--embed writes the model's output, and a --data-only run trains no"),
])
def test_predict_options_that_cannot_work_are_refused_before_a_rank_starts(tmp_path: Path, options, words) -> None:
    with pytest.raises(MomentError, match=words):
        TrainConfig(layout=tmp_path, **options).check()


def test_a_multilabel_dataset_gets_the_classes_whose_logit_is_above_zero(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    graph = {"edge_index": torch.randint(0, N, (2, 3 * N), generator=g), "x": torch.randn(N, 4, generator=g),
             "y": torch.randint(0, 2, (N, C), generator=g)}
    moment.import_graph(graph, tmp_path / "ds")
    bits = torch.tensor([1, 2, 4])
    with moment.open_run(dataset=tmp_path / "ds", features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        assert run.multilabel
        got = run.write_predictions(tmp_path / "p.csv", lambda b: ((b.n_id[: b.batch_size, None] & bits) > 0) * 2.0 - 1)
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert got["multilabel"] and rows[0] == "node,classes"
    assert rows[1:] == [f"{i}," + ";".join(str(j) for j in range(C) if i >> j & 1) for i in range(N)]


def test_embeddings_are_each_nodes_rows_in_the_order_asked(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    rows = lambda b: torch.stack([b.n_id[: b.batch_size].float(), -2.0 * b.n_id[: b.batch_size]], 1)  # noqa: E731
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        got = run.write_embeddings(tmp_path / "e.npy", rows)
        some = [299, 0, 17]
        run.write_embeddings(tmp_path / "s.npy", rows, nodes=some)
        with pytest.raises(MomentError, match=r"write_embeddings: embed\(batch\) gave \[64\], expected the seeds' "
                                              r"rows \[64, width\]"):
            run.write_embeddings(tmp_path / "x.npy", lambda b: b.n_id[: b.batch_size].float())
    assert got == {"path": str(tmp_path / "e.npy"), "nodes": N, "width": 2}
    e = np.load(tmp_path / "e.npy")
    assert e.dtype == np.float32 and e.tolist() == [[i, -2 * i] for i in range(N)]
    assert np.load(tmp_path / "s.npy").tolist() == [[i, -2 * i] for i in some]
    assert not (tmp_path / "x.npy").exists()


def test_blocks_of_nodes_write_the_file_one_pass_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many nodes, a pass holds and gathers a block of them at a time (BLOCK): the file is the same."""
    from moment.runtime import predictions

    ds = _dataset(tmp_path)
    rows = lambda b: torch.stack([b.n_id[: b.batch_size].float(), -2.0 * b.n_id[: b.batch_size]], 1)  # noqa: E731
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=16, quiet=True) as run:
        run.write_predictions(tmp_path / "whole.csv", _scores)
        monkeypatch.setattr(predictions, "BLOCK", 37)
        run.write_predictions(tmp_path / "blocks.csv", _scores)
        assert run.write_embeddings(tmp_path / "e.npy", rows)["width"] == 2
    assert (tmp_path / "blocks.csv").read_text() == (tmp_path / "whole.csv").read_text()
    assert np.load(tmp_path / "e.npy").tolist() == [[i, -2 * i] for i in range(N)]


def test_a_file_that_cannot_be_written_is_one_error_and_nothing_is_left(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    (tmp_path / "afile").write_text("not a folder\n")
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match="afile"):
            run.write_predictions(tmp_path / "afile" / "p.csv", _scores)
        with pytest.raises(MomentError, match="the split has no node to write|no node to write"):
            run.write_predictions(tmp_path / "p.csv", _scores, nodes=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ds", "e.csv", "labels.csv", "nodes.csv"]


def test_the_training_nodes_are_every_one_in_the_splits_order(tmp_path: Path) -> None:
    """The train loader shuffles its nodes and gives each rank an equal share (a remainder left out): a pass over
    the training nodes batches them as ids instead, every one once, in order."""
    ds = _dataset(tmp_path)
    rows = lambda b: b.n_id[: b.batch_size, None].float()  # noqa: E731
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        train = np.asarray(run.dataset.train_idx)
        assert run.write_embeddings(tmp_path / "e.npy", rows, nodes="train")["nodes"] == train.size
        assert run.write_predictions(tmp_path / "p.csv", _scores, nodes="train")["nodes"] == train.size
        with pytest.raises(MomentError, match="nodes='training': a split is one of train, val, test"):
            run.write_predictions(tmp_path / "x.csv", _scores, nodes="training")
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy")[:, 0], train)
    assert [int(r[0]) for r in list(csv.reader((tmp_path / "p.csv").open()))[1:]] == train.tolist()


def test_a_parquet_path_gets_the_same_rows_as_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`.parquet` predictions hold the CSV's rows (typed: the own id as a string, the probability float32), a
    row group a block; embeddings the .npy's rows beside each node's number and own id; a multi-label run's
    classes are lists. Without pyarrow, --predict FILE.parquet is refused before a rank starts."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra) is not installed")
    from moment.runtime import predictions

    ds = _dataset(tmp_path)
    rows = lambda b: torch.stack([b.n_id[: b.batch_size].float(), -2.0 * b.n_id[: b.batch_size]], 1)  # noqa: E731
    monkeypatch.setattr(predictions, "BLOCK", 128)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        got = run.write_predictions(tmp_path / "p.parquet", _scores)
        run.write_predictions(tmp_path / "p.csv", _scores)
        assert run.write_embeddings(tmp_path / "e.parquet", rows)["width"] == 2
        own = run.dataset.node_ids
    assert got == {"path": str(tmp_path / "p.parquet"), "nodes": N, "multilabel": False}
    f = pq.ParquetFile(tmp_path / "p.parquet")
    assert f.metadata.num_row_groups == 3 and f.schema_arrow.names == ["node", "id", "class", "probability"]
    want = list(csv.reader((tmp_path / "p.csv").open()))[1:]
    t = f.read().to_pydict()
    assert [[str(t["node"][i]), t["id"][i], t["class"][i]] for i in range(N)] == [r[:3] for r in want]
    assert t["probability"] == pytest.approx([float(r[3]) for r in want], rel=1e-5)
    e = pq.read_table(tmp_path / "e.parquet").to_pydict()
    assert e["node"] == list(range(N)) and e["id"] == own.tolist()
    assert e["embedding"] == [[i, -2 * i] for i in range(N)]

    g = torch.Generator().manual_seed(0)
    moment.import_graph({"edge_index": torch.randint(0, N, (2, 3 * N), generator=g), "x": torch.randn(N, 4, generator=g),
                         "y": torch.randint(0, 2, (N, C), generator=g)}, tmp_path / "ml")
    bits = torch.tensor([1, 2, 4])
    with moment.open_run(dataset=tmp_path / "ml", features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        run.write_predictions(tmp_path / "m.parquet", lambda b: ((b.n_id[: b.batch_size, None] & bits) > 0) * 2.0 - 1)
    m = pq.read_table(tmp_path / "m.parquet").to_pydict()
    assert m["classes"] == [[j for j in range(C) if i >> j & 1] for i in range(N)]

    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MomentError, match=r"--predict: writing .*p2.parquet as Parquet needs pyarrow"):
        TrainConfig(layout=tmp_path, predict=tmp_path / "p2.parquet").check()


def test_a_node_given_twice_is_one_error_at_the_call_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass's nodes are a batch's seeds, which are distinct: a repeat is refused when the loader or the write is
    made (not by the sampler at iteration, on some ranks, for some world and batch sizes), naming the first entry
    whose node came before, across blocks too."""
    from moment.runtime import predictions

    ds = _dataset(tmp_path)
    twice = r"node 3 is given twice \(at positions 1 and 3\): a pass's nodes must be distinct"
    monkeypatch.setattr(predictions, "BLOCK", 2)  # [7, 3] and [5, 3]: each block alone is distinct
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"run.loader\(nodes=...\) \(list of 5\): " + twice):
            run.loader(nodes=[7, 3, 5, 3, 7])  # made, not iterated
        with pytest.raises(MomentError, match=r"run.loader\(nodes=...\) \(int64 tensor of shape \(2,\)\): node 4 "):
            run.loader(nodes=torch.tensor([4, 4]))
        with pytest.raises(MomentError, match=r"nodes \(NumPy int64 array of shape \(5,\)\): " + twice):
            run.write_predictions(tmp_path / "p.csv", _scores, nodes=np.array([7, 3, 5, 3, 7]))
        with pytest.raises(MomentError, match=twice):
            run.write_embeddings(tmp_path / "e.npy", lambda b: b.x.float()[: b.batch_size], nodes=[7, 3, 5, 3])
        assert len(run.loader(nodes=[5, 3, 7])) == 1 and len(run.loader(nodes=slice(None))) == -(-N // 64)
        mask = np.zeros(N, np.uint8)  # a mask of 0s and 1s, not bools: read as ids, node 0 again and again
        mask[[2, 5]] = 1
        with pytest.raises(MomentError, match=r"node 0 is given twice .*\n  hint: a mask of 0s and 1s is a mask as "
                                              r"bools: give mask.astype\(bool\)"):
            run.loader(nodes=mask)
        assert [b.n_id[: b.batch_size].tolist() for b in run.loader(nodes=mask.astype(bool))] == [[2, 5]]
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "e.npy").exists()


def test_scores_of_another_width_than_the_classes_are_one_error_naming_the_shapes(tmp_path: Path) -> None:
    """A head of the wrong width wrote classes that do not exist (or, with class names, was an IndexError on rank
    0 alone): one error naming the shapes, multi-label too, and no file."""
    ds = _dataset(tmp_path)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        for width in (20, 2):
            with pytest.raises(MomentError, match=rf"write_predictions: scores\(batch\) gave \[64, {width}\], "
                                                  rf"expected the seeds' logits \[64, {C}\] \(num_classes\)"):
                run.write_predictions(tmp_path / "p.csv", lambda b: torch.zeros(b.batch_size, width))  # noqa: B023
    g = torch.Generator().manual_seed(0)
    moment.import_graph({"edge_index": torch.randint(0, N, (2, 3 * N), generator=g), "x": torch.randn(N, 4, generator=g),
                         "y": torch.randint(0, 2, (N, 5), generator=g)}, tmp_path / "ml")
    with moment.open_run(dataset=tmp_path / "ml", features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"gave \[64, 9\], expected the seeds' logits \[64, 5\] \(num_classes\)"):
            run.write_predictions(tmp_path / "p.csv", lambda b: torch.ones(b.batch_size, 9))
    assert not (tmp_path / "p.csv").exists()


def test_scores_or_rows_that_are_not_finite_are_one_error_naming_the_first_node(tmp_path: Path) -> None:
    """NaN logits were written as class 0 with probability nan (softmax's argmax of NaN), NaN embeddings as rows:
    one error naming the first node in `nodes`' order, and no file."""
    ds = _dataset(tmp_path)

    def spoilt(b, value=float("nan"), width=C):
        n = b.n_id[: b.batch_size]
        return torch.zeros(b.batch_size, width).masked_fill(((n == 17) | (n == 290))[:, None], value)

    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"scores\(batch\) gave logits that are not finite \(NaN or infinite\) "
                                              r"for node 290: nothing is written"):
            run.write_predictions(tmp_path / "p.csv", spoilt, nodes=[1, 290, 2, 17])
        with pytest.raises(MomentError, match=r"scores\(batch\) gave logits that are not finite .* for node 17:"):
            run.write_predictions(tmp_path / "p.csv", lambda b: spoilt(b, float("inf")))
        with pytest.raises(MomentError, match=r"embed\(batch\) gave a row that is not finite .* for node 17:"):
            run.write_embeddings(tmp_path / "e.npy", lambda b: spoilt(b, width=8))
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "e.npy").exists()


def test_embedding_rows_of_another_width_in_a_later_batch_are_moments_error(tmp_path: Path) -> None:
    """The width is checked per batch, before a block's batches are joined (NumPy's concatenate said it first)."""
    ds = _dataset(tmp_path)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"write_embeddings: embed\(batch\) gave rows 4 wide after 3$"):
            run.write_embeddings(tmp_path / "e.npy", lambda b: torch.zeros(b.batch_size, 3 + b.index), nodes=range(300))
    assert not (tmp_path / "e.npy").exists()


def test_embeddings_under_a_name_of_another_format_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`e.csv` got .npy bytes: the name says .npy or .parquet, in a script and on the command line."""
    from moment.runtime.config import make_config

    ds = _dataset(tmp_path)
    with moment.open_run(dataset=ds, features="memory", fanouts=[3], batch_size=64, quiet=True) as run:
        with pytest.raises(MomentError, match=r"write_embeddings .*emb\.csv: embeddings are written as \.npy or \.parquet"):
            run.write_embeddings(tmp_path / "emb.csv", lambda b: torch.zeros(b.batch_size, 3))
    assert not (tmp_path / "emb.csv").exists()
    with pytest.raises(MomentError, match=r"--embed .*emb\.csv: embeddings are written as \.npy or \.parquet"):
        make_config(dataset=ds, features="memory", embed=tmp_path / "emb.csv").check()
