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
    out = Path(path)
    ds = run.dataset
    node, top, prob, multi = [], [], [], run.multilabel
    with torch.no_grad():
        for batch in run.loader(nodes, epoch) if isinstance(nodes, str) else run.loader(nodes=nodes):
            logits = scores(batch)
            b = batch.batch_size
            if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != b:
                got = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise MomentError(f"write_predictions: scores(batch) gave {got}, expected the seeds' logits "
                                  f"[{b}, classes]")
            node.append(batch.n_id[:b].cpu().numpy())
            if multi:
                top.append((logits > 0).cpu().numpy())
            else:
                p = torch.softmax(logits.float(), dim=-1)
                conf, cls = p.max(dim=-1)
                top.append(cls.cpu().numpy())
                prob.append(conf.cpu().numpy())
    empty = (np.zeros(0, np.int64), np.zeros((0, run.num_classes), bool) if multi else np.zeros(0, np.int64),
             np.zeros(0, np.float32))
    mine = tuple(np.concatenate(x) if x else e for x, e in zip((node, top, prob), empty))
    shares = run.ctx.all_gather_object(mine)
    # rank r scored every world_size-th of `nodes` from the r-th (moment.workload.sampler.eval_batches)
    at = np.concatenate([r + len(shares) * np.arange(s[0].size) for r, s in enumerate(shares)])
    got = tuple(_placed(np.concatenate([s[i] for s in shares]), at) for i in range(3))
    run.ctx.on_main(lambda: _write(out, ds, got, multi))
    return {"path": str(out), "nodes": int(got[0].size), "multilabel": multi}


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
