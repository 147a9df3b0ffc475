"""Each node's predicted class (or its embedding), written to a file under the graph's own ids and class names.

Why: a model is trained to be used; what a user takes away from a run is its predictions for the nodes they
care about, named as their data names them (an account id, not a row number; "licit", not class 1). The
ranks score their shares of the nodes in an inference pass (`Run.loader(nodes=...)`, no collective while it
runs), a block of nodes at a time; one gather a block brings the shares to rank 0, which streams them into the
file under a temporary name and renames it at the end. `moment train --predict` / `--embed` and a script's
`run.write_predictions` / `run.write_embeddings` are these functions. A path ending in `.parquet` is written as
Parquet (a row group a block), for the pipelines that read Parquet.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from moment.errors import MomentError
from moment.outputs import atomic_file, write_error
from moment.runtime.dist import AgreedError
from moment.runtime.node_index import distinct_ids, node_ids
from moment.workload.graph import SPLITS
from moment.workload.parquet import check_matrix_output, need_pyarrow, parquet_output

# Imports inside functions: pyarrow, for a file that ends in .parquet.

#: rows formatted at once into the file
ROWS = 1 << 16
#: nodes a pass scores before one gather brings their rows to rank 0: bounds what every rank holds (at a width
#: of 256, 64 MiB of rows a block)
BLOCK = 1 << 16


def write_predictions(run: Any, scores: Callable[[Any], torch.Tensor], path: str | Path,
                      nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
    """Every rank: score its share of `nodes` (`scores(batch)` -> the seeds' logits [batch_size, classes]);
    rank 0 writes `path` as CSV, a line a node in `nodes`' order: `node` (its number), `id` (the graph's own
    id, when its import numbered them), `class` (the class name when the labels were names) and
    `probability` (softmax of the logits); on a multi-label dataset `classes`, those whose logit is above 0,
    joined by `;`. A path ending in `.parquet`: the same columns in Parquet (`classes` a list). `nodes`: ids as
    `Run.loader(nodes=...)` takes them, or a split's name: "val" and "test" are then sampled as that split's
    loader of `epoch` samples them (so the last epoch's validation nodes get the classes its reported accuracy
    scored), "train" as its ids. Collective: every rank calls it, at the same
    point."""
    multi, classes = run.multilabel, run.num_classes

    def each(batch: Any) -> tuple[np.ndarray, ...]:
        logits = _seed_rows(scores(batch), batch, "write_predictions: scores(batch)", "logits [{b}, classes]")
        if logits.shape[1] != classes:  # a class past the last is no class (and no name: an IndexError on rank 0)
            raise MomentError(f"write_predictions: scores(batch) gave {list(logits.shape)}, expected the seeds' "
                              f"logits [{batch.batch_size}, {classes}] (num_classes)",
                              hint="the model's last layer gives one logit per class: run.num_classes of them")
        _finite(logits, batch, "write_predictions: scores(batch)", "logits")
        if multi:
            return batch.n_id[: batch.batch_size].cpu().numpy(), (logits > 0).cpu().numpy()
        conf, cls = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return batch.n_id[: batch.batch_size].cpu().numpy(), cls.cpu().numpy(), conf.cpu().numpy()

    columns = _Columns(run.dataset, multi).table
    out = _Parquet(columns, path) if parquet_output(path) else _Csv(columns)
    count = _stream(run, _target(run, nodes), epoch, each, path, "--predict", out.write, text=out.text,
                    finish=out.finish)
    return {"path": str(path), "nodes": count, "multilabel": multi}


def write_embeddings(run: Any, embed: Callable[[Any], torch.Tensor], path: str | Path,
                     nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
    """Every rank: its share of `nodes` through `embed(batch)` (-> the seeds' rows [batch_size, width]); rank
    0 writes `path` as a float32 `.npy` [len(nodes), width], row i for the i-th of `nodes` (every node, by
    default: row i is node i, whose own id is `dataset.node_ids[i]`); a path ending in `.parquet` as Parquet:
    `node`, `id` (when the import numbered the graph's own ids) and `embedding` (float32 vectors). `nodes` and
    `epoch` as `write_predictions` takes them. Collective: every rank calls it, at the same point."""

    check_matrix_output(path, "write_embeddings")
    wide: list[int] = []  # this rank's first batch's width

    def each(batch: Any) -> tuple[np.ndarray, ...]:
        rows = _seed_rows(embed(batch), batch, "write_embeddings: embed(batch)", "rows [{b}, width]")
        if not wide:
            wide.append(rows.shape[1])
        if rows.shape[1] != wide[0]:  # per batch: np.concatenate of the block's batches said it in NumPy's words
            raise MomentError(f"write_embeddings: embed(batch) gave rows {rows.shape[1]} wide after {wide[0]}")
        _finite(rows, batch, "write_embeddings: embed(batch)", "a row")
        return batch.n_id[: batch.batch_size].cpu().numpy(), rows.detach().float().cpu().numpy()

    target = _target(run, nodes)
    total = int(run.dataset.split(target).shape[0]) if isinstance(target, str) else int(target.size)
    width = [0]

    def checked(cols: tuple[np.ndarray, ...], first: bool) -> np.ndarray:
        """The block's rows as float32; the first block's width is the file's (each rank's batches were checked
        against its first, and the ranks against each other, `_same_widths`)."""
        rows = cols[1].astype(np.float32, copy=False)
        if first:
            width[0] = rows.shape[1]
        return rows

    def put(f: IO[Any], cols: tuple[np.ndarray, ...], first: bool) -> None:
        rows = checked(cols, first)
        if first:  # the header: every node's row follows, block after block, in `nodes`' order
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (total, width[0])})
        f.write(np.ascontiguousarray(rows).tobytes())

    own = run.dataset.node_ids

    def table(cols: tuple[np.ndarray, ...], first: bool) -> dict[str, Any]:
        import pyarrow as pa

        rows = checked(cols, first)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(rows).reshape(-1)), width[0])
        return {"node": cols[0], **({"id": own[cols[0]]} if own is not None else {}), "embedding": vectors}

    out = _Parquet(table, path) if parquet_output(path) else None
    count = _stream(run, target, epoch, each, path, "--embed", out.write if out else put, text=False,
                    finish=out.finish if out else None)
    return {"path": str(path), "nodes": count, "width": run.ctx.broadcast_object(width[0])}


def _seed_rows(t: Any, batch: Any, what: str, expected: str) -> torch.Tensor:
    b = batch.batch_size
    if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.shape[0] != b:
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise MomentError(f"{what} gave {got}, expected the seeds' {expected.format(b=b)}")
    return t


def _finite(t: torch.Tensor, batch: Any, what: str, of: str) -> None:
    """Refuse a seed's row that holds NaN or an infinity, naming the first such seed's node (`at`: its place in
    the batch, for the pass's order). Why: softmax's argmax of a NaN row is class 0, written with probability nan
    as if the model had said so; a diverged checkpoint or a bad feature row made a whole file of it."""
    bad = ~torch.isfinite(t.detach()).all(dim=1)
    if bool(bad.any()):
        at = int(torch.nonzero(bad)[0, 0])
        e = MomentError(f"{what} gave {of} that {'are' if of == 'logits' else 'is'} not finite (NaN or infinite) for "
                        f"node {int(batch.n_id[at])}: nothing is written for a value the model did not give",
                        hint="the model diverged, or the features it read hold NaN: check the checkpoint, and the "
                             "layout with `moment layout verify`")
        e.at = at  # type: ignore[attr-defined]
        raise e


def _target(run: Any, nodes: Any) -> str | np.ndarray:
    """`nodes` as a pass reads them: "val" or "test" as they are (their loaders slice every node of the split,
    in order), else int64 ids: the training nodes' too (the train loader shuffles them and gives every rank an
    equal share, leaving a remainder out), and on a link run every split's (its split loaders yield link
    batches: a pass over nodes batches nodes)."""
    if isinstance(nodes, str):
        name = "val" if nodes == "valid" else nodes
        if name not in SPLITS:
            raise MomentError(f"nodes={nodes!r}: a split is one of {', '.join(SPLITS)}")
        if not run.dataset.split(name).shape[0]:
            raise MomentError(f"nodes={nodes!r}: the split has no node to write")
        if name != "train" and run.cfg.task != "link":
            return name
        nodes = np.asarray(run.dataset.split(name))
    given = nodes
    ids, _ = node_ids(nodes, run.num_nodes, "nodes")
    if not ids.size:
        raise MomentError("nodes: no node to write")
    return distinct_ids(ids, given, "nodes")  # the whole list: its blocks are loaders of their own


def _passes(run: Any, target: str | np.ndarray, epoch: int) -> Iterator[Any]:
    """The loaders of a pass: a split's own loader whole (its sampling is the split's), or the ids BLOCK at a
    time, so that what a pass holds and gathers is bounded, however many nodes there are."""
    if isinstance(target, str):
        yield run.loader(target, epoch)
        return
    for s in range(0, target.size, BLOCK):
        yield run.loader(nodes=target[s : s + BLOCK])


def _stream(run: Any, target: str | np.ndarray, epoch: int, each: Callable[[Any], tuple[np.ndarray, ...]], path: str | Path,
            what: str, put: Callable[[IO[Any], tuple[np.ndarray, ...], bool], None], text: bool,
            finish: Callable[[], None] | None = None) -> int:
    """The inference pass, block by block: every rank runs its share of a block through `each` (reading through
    the run's tiers, in no collective), one gather brings the block's rows to every rank in the pass's order, and
    rank 0 `put`s them into the file it writes (a temporary name, `finish`ed, then renamed at the end). A
    failure of rank 0's write travels with the next gather, so every rank stops at the same point with its
    message."""
    count, failed = 0, None
    stack = ExitStack()
    f = None

    def attempt(step: Callable[[], Any]) -> Any:
        nonlocal failed
        try:
            return step()
        except MomentError as e:
            failed = str(e)
        except OSError as e:
            failed = str(write_error(e, path, what))
        return None

    try:
        if run.ctx.is_main:
            f = attempt(lambda: stack.enter_context(atomic_file(path, text=text)))
        for loader in _passes(run, target, epoch):
            mine, bad = _score(loader, each, run.rank, run.world_size)
            if failed is not None:  # rank 0's write failed: said first, as at its place in the file
                bad = (-1, failed)
            shares = run.ctx.all_gather_object(([np.concatenate(c) for c in zip(*mine)] if mine and bad is None
                                                else None, bad))
            if said := [b for _, b in shares if b is not None]:  # every rank alike: the first in the pass's order
                raise AgreedError(min(said)[1])
            _same_widths([s for s, _ in shares])
            cols = _in_order([s for s, _ in shares])
            if f is not None and cols and cols[0].size:
                attempt(lambda: put(f, cols, count == 0))  # noqa: B023 - called at once
            count += int(cols[0].size) if cols else 0
        if f is not None and failed is None and finish is not None:
            attempt(finish)
        if f is not None and failed is None:
            attempt(stack.close)  # renames the file into place
        if (err := run.ctx.all_gather_object(failed)[0]) is not None:
            raise AgreedError(err)
    except BaseException as e:
        stack.__exit__(type(e), e, e.__traceback__)  # the temporary file is removed, nothing renamed
        raise
    return count


def _score(loader: Any, each: Callable[[Any], tuple[np.ndarray, ...]], rank: int,
           world: int) -> tuple[list[tuple[np.ndarray, ...]], tuple[int, str] | None]:
    """This rank's columns of one block's loader, and its first MomentError from `each` (a shape, a width) with
    the position in the pass's order of the first seed it concerns (`at` on the error: a seed of the batch; else
    its first): the block's gather carries it to every rank, which all raise the first (a rank raising alone
    left the others in the gather). The loader is iterated to its end even after an error: on a split layout its
    batches are collective rounds (docs/your-model-loop-data.md)."""
    mine: list[tuple[np.ndarray, ...]] = []
    bad, done = None, 0
    with torch.no_grad():
        for batch in loader:
            if bad is None:
                try:
                    mine.append(each(batch))
                except MomentError as e:
                    bad = (rank + world * (done + getattr(e, "at", 0)), str(e))
            done += batch.batch_size
    return mine, bad


def _same_widths(shares: list[list[np.ndarray] | None]) -> None:
    """Refuse, on every rank alike (each sees every share), columns whose rows are of different widths on
    different ranks: their concatenation was NumPy's error."""
    for c in range(max((len(s) for s in shares if s), default=0)):
        widths = {r: s[c].shape[1:] for r, s in enumerate(shares) if s and s[c].ndim > 1}
        if len(set(widths.values())) > 1:
            said = ", ".join(f"rank {r}'s {w[0] if len(w) == 1 else list(w)} wide" for r, w in widths.items())
            raise AgreedError(f"the ranks' rows differ in width ({said}): every rank's model must give rows as wide")


def _in_order(shares: list[list[np.ndarray] | None]) -> tuple[np.ndarray, ...]:
    """The ranks' columns of one pass in its nodes' order: rank r had every world_size-th from the r-th
    (moment.workload.sampler.eval_batches)."""
    at = np.concatenate([r + len(shares) * np.arange(s[0].shape[0] if s else 0) for r, s in enumerate(shares)])
    out = []
    for col in zip(*[s for s in shares if s]):
        a = np.concatenate(col)
        placed = np.empty_like(a)
        placed[at] = a
        out.append(placed)
    return tuple(out)


class _Parquet:
    """Blocks as the row groups of a Parquet file: `table(cols, first)` gives a block's columns; the schema is
    the first block's, and `finish` writes the footer (before the file is renamed into place)."""

    text = False

    def __init__(self, table: Callable[[tuple[np.ndarray, ...], bool], dict[str, Any]], path: str | Path):
        self.table, self.writer = table, None
        need_pyarrow("writing Parquet", str(path))

    def write(self, f: IO[Any], cols: tuple[np.ndarray, ...], first: bool) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = pa.table(self.table(cols, first))
        self.writer = self.writer or pq.ParquetWriter(f, t.schema)
        self.writer.write_table(t)

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _Columns:
    """A block's predictions as columns (a Parquet file's, or a CSV file's through `_Csv`): `node`, `id` (the
    graph's own, when the import numbered them), `class` (a name or a number) and `probability`; on a
    multi-label dataset `classes`, a list a node."""

    def __init__(self, ds: Any, multi: bool):
        self.own, self.multi = ds.node_ids, multi
        self.names = np.array(ds.class_names, dtype=object) if ds.class_names else None

    def table(self, cols: tuple[np.ndarray, ...], first: bool) -> dict[str, Any]:
        node, top = cols[0], cols[1]
        out: dict[str, Any] = {"node": node, **({"id": self.own[node]} if self.own is not None else {})}
        if self.multi:
            out["classes"] = [(self.names[c] if self.names is not None else c).tolist()
                              for c in (np.flatnonzero(row) for row in top)]
        else:
            out["class"] = self.names[top] if self.names is not None else top.astype(np.int64)
            out["probability"] = cols[2].astype(np.float32)
        return out


class _Csv:
    """The predictions' columns as CSV lines, a header before the first block's: a list of classes joined by
    `;`, a probability to 6 digits."""

    text = True
    finish = None

    def __init__(self, table: Callable[[tuple[np.ndarray, ...], bool], dict[str, Any]]):
        self.table = table

    def write(self, f: IO[Any], cols: tuple[np.ndarray, ...], first: bool) -> None:
        t = self.table(cols, first)
        out = csv.writer(f, lineterminator="\n")  # quotes a field holding a comma, a quote or a line break
        if first:
            out.writerow(list(t))
        for s in range(0, cols[0].size, ROWS):
            out.writerows(zip(*(_text(name, v[s : s + ROWS]) for name, v in t.items())))


def _text(name: str, v: Any) -> list[Any]:
    if name == "classes":
        return [";".join(map(str, c)) for c in v]
    if name == "probability":
        return [f"{p:.6g}" for p in v.tolist()]
    return np.asarray(v).tolist()
