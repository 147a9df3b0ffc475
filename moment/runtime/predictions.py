"""Each node's predicted class, written to a file under the graph's own ids and class names.

Why: a model is trained to be used; what a user takes away from a run is its predictions for the nodes they
care about, named as their data names them (an account id, not a row number; "licit", not class 1). The
ranks score their shares of the nodes in an inference pass (`Run.loader(nodes=...)`, no collective while it
runs), then one gather brings the shares to rank 0, which writes the file atomically. `moment train
--predict` and a script's `run.write_predictions` are this one function.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moment.errors import MomentError
from moment.outputs import atomic_file, writing
from moment.workload.graph import SPLITS

#: rows formatted at once into the file
ROWS = 1 << 16
#: what `--predict-nodes` may name: every node, or a split's
NODE_SETS = ("all", *SPLITS)


def nodes_of(which: str) -> Any:
    """The nodes `--predict-nodes` names, as `write_predictions` takes them: every node, or a split's name."""
    if which == "all":
        return slice(None)
    if which not in SPLITS:
        raise MomentError(f"--predict-nodes {which!r}: choose one of {', '.join(NODE_SETS)}")
    return which


def write_predictions(run: Any, scores: Callable[[Any], torch.Tensor], path: str | Path,
                      nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
    """Every rank: score its share of `nodes` (`scores(batch)` -> the seeds' logits [batch_size, classes]);
    rank 0 writes `path` as CSV, a line a node in `nodes`' order: `node` (its number), `id` (the graph's own
    id, when its import numbered them), `class` (the class name when the labels were names) and
    `probability` (softmax of the logits); on a multi-label dataset `classes`, those whose logit is above 0,
    joined by `;`. `nodes`: ids as `Run.loader(nodes=...)` takes them, or a split's name, whose nodes are then
    sampled as that split's loader of `epoch` samples them (so the last epoch's validation nodes get the
    classes its reported accuracy scored). Collective: every rank calls it, at the same point."""
    multi = run.multilabel

    def each(batch: Any) -> tuple[np.ndarray, ...]:
        logits = _seed_rows(scores(batch), batch, "write_predictions: scores(batch)", "logits [{b}, classes]")
        if multi:
            return batch.n_id[: batch.batch_size].cpu().numpy(), (logits > 0).cpu().numpy(), np.zeros(0, np.float32)
        conf, cls = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return batch.n_id[: batch.batch_size].cpu().numpy(), cls.cpu().numpy(), conf.cpu().numpy()

    got = _infer(run, nodes, epoch, each, 3)
    run.ctx.on_main(lambda: _write(Path(path), run.dataset, got, multi))
    return {"path": str(path), "nodes": int(got[0].size), "multilabel": multi}


def write_embeddings(run: Any, embed: Callable[[Any], torch.Tensor], path: str | Path,
                     nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
    """Every rank: its share of `nodes` through `embed(batch)` (-> the seeds' rows [batch_size, width]); rank
    0 writes `path` as a float32 `.npy` [len(nodes), width], row i for the i-th of `nodes` (every node, by
    default: row i is node i, whose own id is `dataset.node_ids[i]`). `nodes` and `epoch` as
    `write_predictions` takes them. Collective: every rank calls it, at the same point."""

    def each(batch: Any) -> tuple[np.ndarray, ...]:
        rows = _seed_rows(embed(batch), batch, "write_embeddings: embed(batch)", "rows [{b}, width]")
        return batch.n_id[: batch.batch_size].cpu().numpy(), rows.detach().float().cpu().numpy()

    node, rows = _infer(run, nodes, epoch, each, 2)

    def save() -> None:
        with writing(path, "--embed"), atomic_file(path) as f:
            np.save(f, rows)

    run.ctx.on_main(save)
    return {"path": str(path), "nodes": int(node.size), "width": int(rows.shape[1]) if rows.ndim == 2 else 0}


def _seed_rows(t: Any, batch: Any, what: str, expected: str) -> torch.Tensor:
    b = batch.batch_size
    if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.shape[0] != b:
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise MomentError(f"{what} gave {got}, expected the seeds' {expected.format(b=b)}")
    return t


def _infer(run: Any, nodes: Any, epoch: int, each: Callable[[Any], tuple[np.ndarray, ...]],
           columns: int) -> tuple[np.ndarray, ...]:
    """Every rank's share of `nodes` (ids, or a split's name) through `each` (`columns` arrays a batch), gathered
    on every rank in `nodes`' order: the pass reads through the run's tiers in no collective; one gather ends it."""
    mine: list[tuple[np.ndarray, ...]] = []
    with torch.no_grad():
        for batch in run.loader(nodes, epoch) if isinstance(nodes, str) else run.loader(nodes=nodes):
            mine.append(each(batch))
    shares = run.ctx.all_gather_object([np.concatenate(c) for c in zip(*mine)] if mine else None)
    # rank r had every world_size-th of `nodes` from the r-th (moment.workload.sampler.eval_batches)
    at = np.concatenate([r + len(shares) * np.arange(s[0].shape[0] if s else 0) for r, s in enumerate(shares)])
    cols = [[c for c in col if c.shape[0]] for col in zip(*[s for s in shares if s])] or [[]] * columns
    return tuple(_placed(np.concatenate(c), at) if c else np.zeros(0, np.float32) for c in cols)


def _placed(a: np.ndarray, at: np.ndarray) -> np.ndarray:
    if a.shape[0] != at.size:  # a multi-label run's probabilities: none
        return a
    out = np.empty_like(a)
    out[at] = a
    return out


def _write(path: Path, ds: Any, got: tuple[np.ndarray, np.ndarray, np.ndarray], multi: bool) -> None:
    node, top, prob = got
    own, names = ds.node_ids, ds.class_names
    head = ["node", *(["id"] if own is not None else []), "classes" if multi else "class",
            *([] if multi else ["probability"])]
    label = (lambda c: names[c]) if names else str  # noqa: E731
    with writing(path, "--predict"), atomic_file(path, text=True) as f:
        f.write(",".join(head) + "\n")
        for s in range(0, node.size, ROWS):
            n = node[s : s + ROWS]
            cols = [n.tolist()]
            if own is not None:
                cols.append([_field(x) for x in np.asarray(own[n]).tolist()])
            if multi:
                cols.append([_field(";".join(label(int(c)) for c in np.flatnonzero(row))) for row in top[s : s + ROWS]])
            else:
                cols.append([_field(label(int(c))) for c in top[s : s + ROWS]])
                cols.append([f"{p:.6g}" for p in prob[s : s + ROWS].tolist()])
            f.write("".join(",".join(map(str, row)) + "\n" for row in zip(*cols)))


def _field(v: Any) -> str:
    """A CSV field: quoted when it holds a comma, a quote or a line break (as the csv module writes it)."""
    s = str(v)
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n\r') else s
