"""Which kind of Moment document a parsed YAML/JSON file is, recognised by its shape.

A file given to the wrong option (a measurement file as --calibration, a profile as --plan) is valid
YAML or JSON that fails validation with field errors ("Extra inputs are not permitted") that do not say
what happened. Each reader asks `mistaken` when validation fails: when the document is recognisably
another kind, the one message says what the file is, what makes the expected kind and what to do with
this one. The shapes are the top-level fields each kind always has (a test checks every kind Moment
writes against them).

This module sits beside `moment.errors` at the bottom of the package: every reader may import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moment.errors import MomentError


@dataclass(frozen=True)
class Kind:
    name: str  # how a person calls it
    made_by: str  # where one comes from
    use: str  # what to do with one ({path}: the file or directory)
    test: Callable[[Any], bool]  # whether a parsed document has its shape

    @property
    def a(self) -> str:
        return f"an {self.name}" if self.name[0] in "aeiou" else f"a {self.name}"


def _has(*keys: str) -> Callable[[Any], bool]:
    return lambda d: isinstance(d, dict) and all(k in d for k in keys)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("profile", "from `moment scan --out` or `moment export`, or written by hand to `moment schema topology`",
         "pass it as --profile {path}", _has("name", "nodes")),
    Kind("cluster file", "written by hand: servers (profile, inventory, nics) and the network (nic, switch_gbit)",
         "pass it as `moment plan --cluster {path}`", _has("servers", "network")),
    Kind("calibration", "from `moment calibrate --out`", "pass it as --calibration {path} to plan, compare or simulate",
         _has("params", "fitted")),
    Kind("measurement file", "from `moment probe --out`, or written by hand as docs/planning.md shows",
         "fit a calibration from it: `moment calibrate --measured {path} --out cal.yaml`, then pass "
         "--calibration cal.yaml", _has("measurements")),
    Kind("price file", "written by hand: `devices: {MODEL: {price_usd: ..., date: ..., source: ...}}`",
         "pass it as `moment advise --prices {path}`",
         lambda d: isinstance(d, dict) and bool(d)
         and set(d) <= {"currency", "server", "electricity", "devices", "switch_ports"}),
    Kind("plan", "from `moment plan --json`", "pass it as --plan {path} to place or simulate",
         _has("machine", "inventory", "placement", "predicted")),
    Kind("comparison", "from `moment compare --json`",
         "it holds one row per machine; for a plan run `moment plan --profile NAME --json > plan.json`",
         lambda d: isinstance(d, list) and bool(d) and all(_has("profile", "placement", "epoch_read_s")(r) for r in d)),
    Kind("buying advice", "from `moment advise --json`",
         "its best inventory's placement is a plan: run `moment plan` with that inventory and --json",
         _has("budget_usd", "candidates")),
    Kind("replay", "from `moment simulate --json`", "it is a report, not an input", _has("lp_epoch_s", "per_gpu")),
    Kind("dataset", "from `moment data synth` or `moment data import`",
         "pass its directory as --dataset (to place, train, cache simulate) or to `moment data info`",
         _has("num_nodes", "feature_dim", "files")),
    Kind("layout", "from `moment place --out`",
         "pass its directory as --layout (to train, simulate, data pack) or to `moment layout info`",
         _has("shards", "bins", "row")),
    Kind("layout's pack", "from `moment data pack`", "it is part of a layout: pass the layout's directory",
         _has("layout_index_sha256", "files")),
    Kind("split layout's cluster manifest", "from `moment place --machines` or `--cluster`",
         "it is part of a split layout: pass its directory to `moment layout verify/info/rm`, and train each "
         "machine with --layout DIR/MACHINE", _has("machines", "owners", "replicated_rows")),
    Kind("hotness", "from `moment data presample --out`", "pass its directory as --hotness (to place, cache simulate)",
         _has("num_batches", "sampled_total", "unique_ratio")),
    Kind("topology XML", "from NCCL (NCCL_TOPO_DUMP_FILE) or hwloc (`lstopo --of xml`)",
         "turn it into a profile: `moment scan --from-nccl-xml {path} --out profile.yaml` (or --from-hwloc-xml)",
         lambda d: isinstance(d, str) and d.lstrip().startswith("<")),
)}


def kind_of(data: Any) -> Kind | None:
    """The kind of Moment document `data` (parsed YAML or JSON) has the shape of, if any."""
    return next((k for k in KINDS.values() if k.test(data)), None)


def mistaken(data: Any, expected: str, source: str, path: str | None = None) -> MomentError | None:
    """The message for a document of another kind given where `expected` (a name in KINDS) was asked
    for; None when it is of the expected kind or of none Moment knows (the reader then says what is
    wrong with it). `path` is what the hint tells the user to pass (default `source`)."""
    found, want = kind_of(data), KINDS[expected]
    if found is None or found is want:
        return None
    return MomentError(f"this is {found.a} ({found.made_by}), not {want.a} ({want.made_by})",
                       source=source, hint=found.use.format(path=path or source))


#: the files Moment's directories describe themselves in (datasets and layouts: manifest.json; a
#: hotness: hotness.json), small enough to read whole
HEADS = ("manifest.json", "hotness.json")
_HEAD_LIMIT = 1 << 20


def mistaken_dir(path: str | Path, expected: str) -> MomentError | None:
    """`mistaken` for a directory that lacks the file of the `expected` kind: the message when it is
    recognisably another kind of Moment directory (a hotness given as a layout), else None."""
    for name in HEADS:
        f = Path(path) / name
        try:
            if f.stat().st_size > _HEAD_LIMIT:
                continue
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if (wrong := mistaken(data, expected, str(path))) is not None:
            return wrong
    return None
