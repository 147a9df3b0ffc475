"""What the runtime's torch objects hold, stated without torch: the arithmetic of a run's memory budget (the
built-in models' training step, the link decoder, a round of the peer and remote exchanges, the pipeline's
held batches). It lives here, not beside the objects, so that `moment train --dry-run` resolves a run plan
without loading torch; the classes that hold the objects (SAGE, GAT, RowExchange, Pipeline) state their
sizes through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moment.errors import MomentError
from moment.runtime.config import BUILT_IN_MODELS, DEFAULT_HIDDEN, TrainConfig
from moment.runtime.gather import staging_bytes

TASKS = ("node", "link")
GAT_HEADS = 8  # the paper's GAT: 8 heads of `hidden` each in every layer but the last
_F32 = 4  # bytes of a float32: the models and the link decoder compute in float32 (`item.x.float()`)
#: --optimizer: weight-sized tensors each keeps per parameter (Adam's two moments, SGD's momentum)
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "sgd": 1}
#: the most bytes of rows one chunk of an exchange round moves into a member, and out of it (`chunk_rows`)
CHUNK_BYTES = 4 << 20
KEY_BYTES = 8  # an exchanged row's int64 key
#: the remote tier's serving reader: a round's asked rows are read in windows of this many bytes, this many at once
SERVE_WINDOW = 1 << 20
SERVE_INFLIGHT = 2


@dataclass(frozen=True)
class LayerExtent:
    """One layer's block at a batch's extent: its source nodes, target nodes and edges (`Block`)."""

    src: int
    dst: int
    edges: int


class SageSizes:
    """GraphSAGE's widths, weights and step memory (moment.runtime.models.SAGE states its sizes by these)."""

    @staticmethod
    def dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
        """Every layer's input width, then the output's."""
        return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]

    @staticmethod
    def layer_weights(a: int, b: int) -> int:
        """Parameters of one SAGEConv(a, b): lin_l with its bias, lin_r without."""
        return 2 * a * b + b

    @staticmethod
    def layer_bytes(e: LayerExtent, a: int, b: int, last: bool) -> tuple[int, int]:
        """(the most one SAGEConv layer of a -> b widths holds while it runs, forward or backward; what its
        forward leaves saved for the backward while the later layers run).

        Forward: the aggregation's sum and mean beside a value per edge (the degree count's ones; the layer
        never makes the per-edge messages, `moment.runtime.layers._NeighbourSum`). Backward of a hidden layer:
        the saved ReLU output, dropout mask and output, and two gradients of the same size, beside the saved
        mean. Saved: the mean (lin_l's input), and of a hidden layer the ReLU output, the dropout mask and
        output."""
        fwd = 2 * e.dst * a + e.edges
        bwd = e.dst * a + (5 if not last else 3) * e.dst * b
        return max(fwd, bwd) * _F32, e.dst * (a + (3 * b if not last else b)) * _F32


class GatSizes:
    """GAT's widths, weights and step memory (moment.runtime.models.GAT states its sizes by these)."""

    @staticmethod
    def dims(in_dim: int, hidden: int, out_dim: int, num_layers: int, heads: int = GAT_HEADS) -> list[int]:
        """Every layer's input width, then the output's (a hidden layer's output: its heads side by side)."""
        return [in_dim] + [hidden * heads] * (num_layers - 1) + [out_dim]

    @staticmethod
    def layer_weights(a: int, w: int) -> int:
        """Parameters of one GATConv whose heads are `w` wide together: its projection, the two attention
        vectors and the bias."""
        return a * w + 3 * w

    @staticmethod
    def layer_bytes(e: LayerExtent, a: int, w: int, last: bool, heads: int = GAT_HEADS) -> tuple[int, int]:
        """(the most one GATConv layer whose heads are `w` wide together holds while it runs; what its forward
        leaves saved while the later layers run), as `SageSizes.layer_bytes`.

        Every source node is projected (`w` wide) and every edge carries a projected message, weighted by its
        attention (a second edge-sized tensor); the backward holds the gradients of both beside the saved
        ones: two source-sized, three edge-sized and two target-sized tensors at the most. Saved: the
        projection, the messages, the attention (a few values per edge and head) and the hidden layer's
        output, ELU output, dropout mask and output."""
        h = 1 if last else heads
        run = (2 * e.src + 3 * e.edges + 2 * e.dst) * w
        saved = (e.src + e.edges + (4 if not last else 1) * e.dst) * w + 4 * e.edges * h
        return run * _F32, saved * _F32


_SIZES: dict[str, type[SageSizes] | type[GatSizes]] = {"sage": SageSizes, "gat": GatSizes}


def model_sizes(name: str) -> type[SageSizes] | type[GatSizes]:
    """The size rules of built-in model `name`; another name is the user's error."""
    if name not in _SIZES:
        raise MomentError(f"--model {name!r}: choose sage or gat")
    return _SIZES[name]


def hidden_width(name: str, hidden: int | None) -> int:
    """A hidden layer's width (GAT: per head): `hidden`, else the paper's settings: GraphSAGE 256, GAT 64."""
    return hidden or (DEFAULT_HIDDEN if name == "sage" else 64)


def step_bytes(name: str, in_dim: int, num_classes: int, hidden: int | None, layers: Sequence[LayerExtent], *,
               rows: int, float_copy: bool, head_bytes: int = 0, optimizer_slots: int = 2) -> int:
    """What one training step of `name` holds beyond the batch's features: the most any layer holds while it
    runs (forward or backward) beside what the layers before it saved, and the model's weights with their
    gradients, DDP's gradient buckets and the optimizer's state (`optimizer_slots` weight-sized tensors:
    `OPTIMIZER_SLOTS`).
    `num_classes`: the model's output width (a link model's: its embeddings', `out_dim`);
    `layers`: the batch's blocks at its extent, input layer first; `rows`: its input rows; `float_copy`: the
    features are not float32, so the step holds a float32 copy of them (`x.float()`); `head_bytes`: the most
    what runs on the model's output holds, beside every layer's saved tensors (the link decoder:
    `decoder_bytes`).

    Stated from the layers' autograd graphs (torch 2.13, torch-geometric 2.x), checked against measured
    steps (tests/test_models.py): the memory budget charges it as the run's "training" item."""
    cls = model_sizes(name)
    dims = cls.dims(in_dim, hidden_width(name, hidden), num_classes, len(layers))
    most = saved = 0
    for i, e in enumerate(layers):
        run, keep = cls.layer_bytes(e, dims[i], dims[i + 1], i == len(layers) - 1)
        most = max(most, saved + run)
        saved += keep
    most = max(most, saved + head_bytes)
    return (most + (rows * in_dim * _F32 if float_copy else 0)
            + (3 + optimizer_slots) * weights(name, in_dim, num_classes, hidden, len(layers)) * _F32)


def weights(name: str, in_dim: int, num_classes: int, hidden: int | None, num_layers: int) -> int:
    """Parameters of `build_model(name, in_dim, num_classes, num_layers, hidden)`, without building it."""
    cls = model_sizes(name)
    dims = cls.dims(in_dim, hidden_width(name, hidden), num_classes, num_layers)
    return sum(cls.layer_weights(dims[i], dims[i + 1]) for i in range(num_layers))


def out_dim(task: str, model: str, hidden: int | None, num_classes: int) -> int:
    """The model's output width for `task`: node classification's `num_classes`; link prediction's embeddings
    are as wide as a hidden layer (GAT: one head's width, its last layer has one head)."""
    if task == "node":
        return int(num_classes)
    if task == "link":
        return hidden_width(model, hidden)
    raise MomentError(f"--task {task!r}: choose {' or '.join(TASKS)}")


def multilabel_targets(task: str, dataset_multilabel: bool) -> bool:
    """Whether a run's targets are a 0/1 a class (`[B, C]` floats, binary cross entropy): a multi-label
    dataset's node task. Link prediction scores edges whatever the labels are."""
    return task == "node" and bool(dataset_multilabel)


def decoder_bytes(num_labels: int, num_endpoints: int, width: int) -> int:
    """The most the decoder and loss of a link step hold beside the model's saved tensors (`step_bytes`'
    `head_bytes`), for `num_labels` label edges over `num_endpoints` embeddings `width` wide.

    Forward: the two gathered endpoint rows (kept for the product's backward) and their product. Backward:
    the product's two gradients beside the kept rows, then the two gathers' gradients, each as large as the
    embeddings, beside the product's gradients."""
    edge = num_labels * width
    return max(4 * edge, 2 * edge + 2 * num_endpoints * width) * _F32


def stated_training_bytes(cfg: TrainConfig, in_dim: int, num_classes: int, layers: Sequence[LayerExtent], *,
                          rows: int, float_copy: bool, head_bytes: int = 0) -> int | None:
    """The budget's "training" item of a built-in model (`step_bytes` with --optimizer's slots); None for a
    model of the user's own, which moment.runtime.model_spec.training_bytes asks or measures."""
    if cfg.model not in BUILT_IN_MODELS:
        return None
    return step_bytes(cfg.model, in_dim, num_classes, cfg.hidden, layers, rows=rows, float_copy=float_copy,
                      optimizer_slots=OPTIMIZER_SLOTS[cfg.optimizer], head_bytes=head_bytes)


def chunk_rows(row_bytes: int, members: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows one chunk moves into a member and out of it at most: `chunk_bytes` of rows, and at least one row
    of each member (a pair's keys are split evenly over the chunks, so each pair moves at least one)."""
    return max(chunk_bytes // max(int(row_bytes), 1), int(members), 1)


def exchange_round_bytes(rows: int, row_bytes: int, members: int, held: int | None = None, *,
                         chunk_bytes: int = CHUNK_BYTES) -> int:
    """The most one round of the row exchange holds on a member when every member asks for at most `rows`
    rows of `row_bytes` each, and at most `held` of any one member (what a member holds; None: no limit):
    the keys and rows of one chunk it asks and of one it serves the others, each row with its int64 key.
    At most `chunk_rows` each way, whatever `rows` is."""
    others = max(int(members), 1) - 1
    each = int(rows) if held is None else min(int(rows), int(held))
    cap = chunk_rows(row_bytes, members, chunk_bytes)
    asked, served = min(int(rows), others * each, cap), min(others * each, cap)
    return (asked + served) * (int(row_bytes) + KEY_BYTES)


def remote_round_bytes(rows: int, row_bytes: int, machines: int) -> int:
    """The most one round of the remote exchange holds on a rank when every rank asks at most `rows` rows
    (a batch's) of the others: what the exchange states for `machines` members."""
    return exchange_round_bytes(rows, row_bytes, machines)


def remote_reader_bytes(align: int) -> int:
    """The remote tier's serving reader's staging buffers."""
    return staging_bytes(align, SERVE_WINDOW, SERVE_INFLIGHT)


#: batches a loader paused for another keeps beside the other's (a loop's validation inside its train loop, `zip` over
#: two loaders: moment.runtime.pipeline.Turns): the one its loop holds, and its next where exchange rounds ran for it
#: (they are never run twice); its reads in flight and its other ready batches are dropped
PAUSED_BATCHES = 2


def held_batches(depth: int) -> int:
    """Batches a pipeline of this `depth` holds besides those its source has submitted (`lookahead`):
    `depth` ready ones (the next, whose exchange rounds the training thread has started, and the queued
    ones; at least those two), one being assembled and one being trained, and those of a loader paused
    beside it (`PAUSED_BATCHES`; the memory budget charges this)."""
    return max(2, depth) + 2 + PAUSED_BATCHES
