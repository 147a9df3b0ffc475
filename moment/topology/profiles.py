"""YAML profiles: load, save, built-ins and `--set path=value` what-if overrides."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from moment.documents import mistaken
from moment.errors import Flag, MomentError, cli_flag, validation_error, validation_lines
from moment.inputs import exists, read_text
from moment.outputs import atomic_write
from moment.topology.limits import MAX_DEPTH
from moment.topology.model import Topology

def _profile_dir() -> Path:
    """Built-in profiles: $MOMENT_PROFILE_DIR, else the checkout's topology_profiles/, else the copy
    a non-editable install puts under <prefix>/share/moment/."""
    if "MOMENT_PROFILE_DIR" in os.environ:
        return Path(os.environ["MOMENT_PROFILE_DIR"])
    checkout = Path(__file__).resolve().parents[2] / "topology_profiles"
    return checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "moment" / "topology_profiles"


PROFILE_DIR = _profile_dir()


def builtin_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def format_validation_error(err: ValidationError, source: str, data: Any = None) -> MomentError:
    """Turn pydantic's error list into one readable message naming the field paths (a node by its id
    when `data`, the profile's mapping, is given)."""
    return validation_error(err, "invalid topology", source=source, skip=_DISCRIMINATOR_TAGS,
                            relabel=lambda loc: _by_id(loc, data))


_DISCRIMINATOR_TAGS = {"socket", "root_complex", "switch", "slot", "gpu", "ssd", "nic", "nvswitch", "other"}


def topology_from_dict(data: Any, source: str) -> Topology:
    if not isinstance(data, dict):
        raise mistaken(data, "profile", source) or MomentError(
            "a profile must be a YAML mapping with 'name' and 'nodes'", source=source)
    try:
        return Topology.model_validate(data)
    except ValidationError as err:
        raise mistaken(data, "profile", source) or format_validation_error(err, source, data) from None


def read_yaml(path: str | Path, what: str) -> Any:
    """The YAML file `what` at `path` as data: every YAML input (profiles, calibrations, measurement and
    price files) is read here, so each says the same about a missing, unreadable or non-text file."""
    return parse_yaml(read_text(path, what), str(path))


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, line: int):
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's safe loader where PyYAML has it (about 5x faster on a large upload), else the Python one,
    refusing a key given twice in one mapping (PyYAML keeps the last without a word: a profile's
    second `nodes:` replaced the first). A `<<` merge's keys may be overridden, as YAML says."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key], line)
                    seen[key] = line
                except TypeError:  # an unhashable key: the constructor below says so
                    continue
        return super().construct_mapping(node, deep=deep)


_LOADER = _StrictLoader


def _check_depth(text: str, source: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH before the (recursive) composer sees it: the parser's events
    come one at a time, so a small hostile text cannot end in RecursionError or a C stack overflow."""
    def too_deep(line: int) -> MomentError:
        return MomentError(f"not valid YAML at line {line}: nested more than {MAX_DEPTH} deep", source=source)

    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise too_deep(event.start_mark.line + 1)
            elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                depth -= 1
    except yaml.YAMLError as e:  # libyaml's scanner has its own, higher limit, met while it looks ahead
        mark = getattr(e, "problem_mark", None)
        if mark is not None and "nesting depth" in str(getattr(e, "problem", "")):
            raise too_deep(mark.line + 1) from None
        raise


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as data; a syntax error, nesting deeper than MAX_DEPTH or a key given twice in one
    mapping is one line naming `source` and where it is. Every YAML input (profiles, `--set` values, calibrations, measurements, prices)
    is read here."""
    try:
        _check_depth(text, source)
        return yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only
    except _DuplicateKey as e:
        also = f" (first at line {e.first})" if e.first != e.line else ""
        raise MomentError(f"line {e.line}: key {e.key!r} appears twice{also}", source=source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MomentError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", source=source) from None


def resolve_profile(name_or_path: str) -> Path:
    if not str(name_or_path).strip():  # `--profile "$PROFILE"` with the variable unset: not the directory `.`
        raise MomentError("an empty profile name",
                          hint=f"give a built-in profile ({', '.join(builtin_names())}) or a path to a YAML file")
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or exists(p):
        return p
    builtin = PROFILE_DIR / f"{name_or_path}.yaml"
    if exists(builtin):
        return builtin
    raise MomentError(
        f"unknown profile {name_or_path!r}",
        hint=f"built-in profiles: {', '.join(builtin_names())}; or give a path to a YAML file",
    )


#: the key `moment scan --json` adds beside the topology (the sources used and missing): not the machine's
SCAN_REPORT = "scan_report"


def load_profile(name_or_path: str, overrides: list[str] | None = None, *, flag: Flag = cli_flag) -> Topology:
    """A profile, with `--set` overrides applied. A profile that is invalid by itself blames its file;
    one that only the overrides make invalid blames the first `--set` that breaks it (spelled by `flag`).
    `moment scan --json`'s output is one: its scan report is left out."""
    path = resolve_profile(name_or_path)
    data = read_yaml(path, "profile")
    if isinstance(data, dict):
        data.pop(SCAN_REPORT, None)
    if not overrides:
        return topology_from_dict(data, str(path))
    if not isinstance(data, dict):
        raise MomentError("a profile must be a YAML mapping", source=str(path))
    pristine = copy.deepcopy(data)
    topology_from_dict(copy.deepcopy(data), str(path))
    for ov in overrides:
        apply_override(data, ov, flag=flag)
    try:
        return Topology.model_validate(data)
    except ValidationError:
        raise _blame_override(pristine, overrides, path, flag) from None


def _blame_override(data: dict, overrides: list[str], path: Path, flag: Flag) -> MomentError:
    """Apply the overrides one at a time to find the first that makes the profile invalid."""
    err: ValidationError | None = None
    for ov in overrides:
        apply_override(data, ov, flag=flag)
        try:
            Topology.model_validate(data)
        except ValidationError as e:
            err = e
            break
    assert err is not None
    key = ov.split("=", 1)[0].strip()
    lines = [line.removeprefix(f"{key}: ") for line in _error_lines(err, data)]  # the key is said once, in front
    return MomentError(f"{flag('set')} {_shown(ov)}: " + ("; ".join(lines)),
                       hint=f"the profile {path.name} is valid without this override", field="set")


def _by_id(loc: list, data: Any) -> list:
    """A location with the list position of a node replaced by its id (`nodes.sw0.link.width`, the
    spelling `--set` takes), where the id can stand in a path."""
    if (len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int) and isinstance(data, dict)
            and isinstance(data.get("nodes"), list) and loc[1] < len(data["nodes"])
            and isinstance(data["nodes"][loc[1]], dict) and isinstance(data["nodes"][loc[1]].get("id"), str)
            and data["nodes"][loc[1]]["id"] and "." not in data["nodes"][loc[1]]["id"]):
        loc[1] = data["nodes"][loc[1]]["id"]
    return loc


def _error_lines(err: ValidationError, data: Any = None) -> list[str]:
    """pydantic's errors as 'path: message', list positions of nodes named by their id."""
    return validation_lines(err, skip=_DISCRIMINATOR_TAGS, relabel=lambda loc: _by_id(loc, data))


def dump_yaml(topo: Topology, header: str | None = None) -> str:
    data = topo.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    if header:
        body = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + body
    return body


def save_profile(topo: Topology, path: Path, header: str | None = None, what: str | None = None) -> None:
    atomic_write(path, dump_yaml(topo, header), what)


# ---- what-if overrides -----------------------------------------------------------------------------
def _shown(spec: str, most: int = 100) -> str:
    """An override as messages quote it: cut after `most` characters."""
    return spec if len(spec) <= most else spec[:most] + "..."


def _step(container: Any, key: str, spec: str, flag: Flag) -> Any:
    """One path segment: a dict key, a list index, or a list element selected by its id/name."""
    if isinstance(container, dict):
        if key not in container:
            container[key] = {}
        return container[key]
    if isinstance(container, list):
        for item in container:  # an id first: slots are often numbered as the board prints them ('3')
            if isinstance(item, dict) and key in (item.get("id"), item.get("name")):
                return item
        if key.lstrip("-").isdigit():
            i = int(key)
            if not -len(container) <= i < len(container):
                raise MomentError(f"{flag('set')} {_shown(spec)}: index {i} is out of range (list has {len(container)} "
                                  "items)", field="set")
            return container[i]
        raise MomentError(f"{flag('set')} {_shown(spec)}: no element with id {key!r}", field="set")
    raise MomentError(f"{flag('set')} {_shown(spec)}: cannot descend into {type(container).__name__} at {key!r}",
                      field="set")


def _split_path(path: str) -> list[str]:
    """`nodes.sw1.link.gen` -> its segments; `nodes[sw.0].link` and `nodes."sw.0".link` (or '...') keep an
    id with a dot in it whole."""
    out: list[str] = []
    cur, i = "", 0
    while i < len(path):
        c = path[i]
        close = {"[": "]", '"': '"', "'": "'"}.get(c)
        if close is not None and not cur:
            end = path.find(close, i + 1)
            if end < 0:
                raise ValueError(f"the {c} that opens a segment is never closed by {close}")
            out.append(path[i + 1:end])
            i = end + 1
            continue
        if c in ".[":
            if cur:
                out.append(cur)
            cur = ""
            if c == "[":
                continue  # the same '[' again, now opening a segment read whole
        else:
            cur += c
        i += 1
    if cur:
        out.append(cur)
    return out


def apply_override(data: dict, spec: str, *, flag: Flag = cli_flag) -> None:
    """Apply `path=value` or `path+=value` (append to a list) to the profile's raw mapping.

    Paths are dotted; list elements are chosen by `id` (or `name`), else by index: `nodes.sw1.link.gen=5`,
    `nodes[ssd_bay0].link.bandwidth_gbps=7`, `links+={a: s1, b: s2, kind: nvlink, count: 4}`. An id match
    wins over an index (`nodes.3` is the node with id '3' where there is one); `nodes[sw.0]` or
    `nodes."sw.0"` names an id with a dot in it.
    Errors name the override as `flag('set')` spells it.
    """
    def bad(problem: str) -> MomentError:
        return MomentError(f"{flag('set')} {_shown(spec)!r}: {problem}", field="set")

    if "=" not in spec:
        raise bad("expected PATH=VALUE")
    path, value_text = spec.split("=", 1)
    append = path.endswith("+")
    path = path.rstrip("+").strip()
    try:
        value = parse_yaml(value_text, "the value")
    except MomentError as e:
        raise bad(str(e)) from None
    try:
        parts = _split_path(path)
    except ValueError as e:
        raise bad(str(e)) from None
    if not parts:
        raise bad("empty path")
    cur: Any = data
    for key in parts[:-1]:
        cur = _step(cur, key, spec, flag)
    last = parts[-1]
    if append:
        target = _step(cur, last, spec, flag) if not (isinstance(cur, dict) and last not in cur) else None
        if target is None:
            cur[last] = target = []
        if not isinstance(target, list):
            raise bad(f"{path} is not a list")
        target.append(value)
    elif isinstance(cur, dict):
        cur[last] = value
    elif isinstance(cur, list):
        item = _step(cur, last, spec, flag)
        idx = cur.index(item)
        cur[idx] = value
    else:
        raise bad(f"cannot set a field of {type(cur).__name__}")
