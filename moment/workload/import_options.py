"""The choices an import offers and their defaults, in one place that imports nothing heavy (no numpy), so
the command line can spell them in its help without loading the importers."""

from __future__ import annotations

from dataclasses import dataclass

from moment.errors import MomentError, cli_flag

#: what an import may do with repeated edges and with self-loops
EDGE_CHOICES = ("keep", "drop")
#: where `import_ogb` reads a dataset from: raw/ (the download), processed/ (what ogb's loaders wrote)
OGB_LAYOUTS = ("auto", "raw", "processed")
#: train, validation and test shares of the labelled nodes in the seeded random split an import draws when the
#: input has none: ogbn-papers100M's (about 1% of its nodes train), so a synthetic run's seeds per epoch match
#: the paper's; a graph whose every node is labelled usually wants more (`--random-split 0.6,0.2,0.2`)
RANDOM_SPLIT = (0.01, 0.005, 0.005)
#: the fewest training nodes a drawn split takes (of a graph with at least twice as many), so that a small graph
#: still has batches to train on
MIN_TRAIN = 512
RANDOM_SPLIT_HELP = ("train,val,test shares of the labelled nodes in the seeded random split drawn when the input "
                     f"has none (default {','.join(map(str, RANDOM_SPLIT))}, ogbn-papers100M's, with at least "
                     f"{MIN_TRAIN} train nodes; e.g. 0.6,0.2,0.2 to train on most of them)")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise MomentError(f"{cli_flag(name)} {value!r}: must be one of {', '.join(choices)}")
    return value


def check_feature_dim(d: int) -> int:
    """The length of features an import generates for a graph without them: one line naming the flag."""
    if int(d) < 1:
        raise MomentError(f"--feature-dim {d}: must be at least 1 (the length of the features generated when the "
                          "input has none)")
    return int(d)


def check_node_count(n: int | None, source: str = "--num-nodes") -> int | None:
    """A node count given with the graph (`--num-nodes`, a PyG graph's `num_nodes`): one node at least."""
    if n is not None and int(n) < 1:
        raise MomentError(f"a node count of {n}: a graph has at least one node", source=source)
    return n


@dataclass(frozen=True)
class EdgePolicy:
    """Keep or drop repeated edges and self-loops. Defaults are what imports always did: duplicates dropped
    (a repeated neighbour would be sampled twice as often), self-loops kept (GNN layers often add them
    anyway). Either way the import counts them (`EdgeReport`)."""

    duplicates: str = "drop"
    self_loops: str = "keep"

    def __post_init__(self) -> None:
        for name in ("duplicates", "self_loops"):
            check_choice(name, getattr(self, name), EDGE_CHOICES)


def random_split_shares(shares: str | tuple[float, ...] | list[float] | None, has_split: bool,
                        flag: str = "--random-split") -> tuple[float, float, float]:
    """The shares of an import's random split: the default (`RANDOM_SPLIT`) when none is given, else the three
    given (text "0.6,0.2,0.2" or numbers), each in (0, 1] and together at most 1. Given for an input that has its
    own split, they are refused: that split is kept, and the shares would be silently ignored."""
    if shares is None:
        return RANDOM_SPLIT
    if has_split:
        raise MomentError(f"{flag}: the input has its own split, which is kept as given",
                          hint=f"leave {flag} out, or import without the split to draw a random one")
    given = shares.split(",") if isinstance(shares, str) else list(shares)
    try:
        out = tuple(float(x) for x in given)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or not all(0 < x <= 1 for x in out) or sum(out) > 1 + 1e-9:
        shown = shares if isinstance(shares, str) else ",".join(map(str, given))
        raise MomentError(f"{flag} {shown}: give three shares of the labelled nodes, train,val,test, each above 0 "
                          "and together at most 1 (e.g. 0.6,0.2,0.2)")
    return out  # type: ignore[return-value]
