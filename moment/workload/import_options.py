"""The choices an import offers and their defaults, in one place that imports nothing heavy (no numpy), so
the command line can spell them in its help without loading the importers."""

from __future__ import annotations

from dataclasses import dataclass

from moment.errors import MomentError, cli_flag

#: what an import may do with repeated edges and with self-loops
EDGE_CHOICES = ("keep", "drop")
#: where `import_ogb` reads a dataset from: raw/ (the download), processed/ (what ogb's loaders wrote)
OGB_LAYOUTS = ("auto", "raw", "processed")


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
