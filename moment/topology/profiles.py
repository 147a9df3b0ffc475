"""YAML profiles: load, save, built-ins and `--set path=value` what-if overrides."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from moment.errors import MomentError, validation_error, validation_lines
from moment.outputs import atomic_write
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
        raise MomentError("a profile must be a YAML mapping with 'name' and 'nodes'", source=source)
    try:
        return Topology.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err, source, data) from None


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MomentError("file not found", source=str(path)) from None
    except OSError as e:
        raise MomentError(f"cannot read: {e.strerror}", source=str(path)) from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as data; a syntax error is one line naming `source` and where it is."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MomentError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", source=source) from None


def resolve_profile(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    builtin = PROFILE_DIR / f"{name_or_path}.yaml"
    if builtin.exists():
        return builtin
    raise MomentError(
        f"unknown profile {name_or_path!r}",
        hint=f"built-in profiles: {', '.join(builtin_names())}; or give a path to a YAML file",
    )


def load_profile(name_or_path: str, overrides: list[str] | None = None) -> Topology:
    """A profile, with `--set` overrides applied. A profile that is invalid by itself blames its file;
    one that only the overrides make invalid blames the first `--set` that breaks it."""
    path = resolve_profile(name_or_path)
    data = _read_yaml(path)
    if not overrides:
        return topology_from_dict(data, str(path))
    if not isinstance(data, dict):
        raise MomentError("a profile must be a YAML mapping", source=str(path))
    pristine = copy.deepcopy(data)
    topology_from_dict(copy.deepcopy(data), str(path))
    for ov in overrides:
        apply_override(data, ov)
    try:
        return Topology.model_validate(data)
    except ValidationError:
        raise _blame_override(pristine, overrides, path) from None


def _blame_override(data: dict, overrides: list[str], path: Path) -> MomentError:
    """Apply the overrides one at a time to find the first that makes the profile invalid."""
    err: ValidationError | None = None
    for ov in overrides:
        apply_override(data, ov)
        try:
            Topology.model_validate(data)
        except ValidationError as e:
            err = e
            break
    assert err is not None
    lines = _error_lines(err, data)
    return MomentError(f"--set {ov}: " + ("; ".join(lines)),
                       hint=f"the profile {path.name} is valid without this override")


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
def _step(container: Any, key: str, spec: str) -> Any:
    """One path segment: a dict key, a list index, or a list element selected by its id/name."""
    if isinstance(container, dict):
        if key not in container:
            container[key] = {}
        return container[key]
    if isinstance(container, list):
        if key.lstrip("-").isdigit():
            i = int(key)
            if not -len(container) <= i < len(container):
                raise MomentError(f"--set {spec}: index {i} is out of range (list has {len(container)} items)")
            return container[i]
        for item in container:
            if isinstance(item, dict) and key in (item.get("id"), item.get("name")):
                return item
        raise MomentError(f"--set {spec}: no element with id {key!r}")
    raise MomentError(f"--set {spec}: cannot descend into {type(container).__name__} at {key!r}")


def _split_path(path: str) -> list[str]:
    out: list[str] = []
    for part in path.replace("[", ".").replace("]", "").split("."):
        if part:
            out.append(part)
    return out


def apply_override(data: dict, spec: str) -> None:
    """Apply `path=value` or `path+=value` (append to a list) to the profile's raw mapping.

    Paths are dotted; list elements are chosen by index or by `id`: `nodes.sw1.link.gen=5`,
    `nodes[ssd_bay0].link.bandwidth_gbps=7`, `links+={a: s1, b: s2, kind: nvlink, count: 4}`.
    """
    if "=" not in spec:
        raise MomentError(f"--set {spec!r}: expected PATH=VALUE")
    path, value_text = spec.split("=", 1)
    append = path.endswith("+")
    path = path.rstrip("+").strip()
    try:
        value = yaml.safe_load(value_text)
    except yaml.YAMLError:
        raise MomentError(f"--set {spec!r}: value is not valid YAML") from None
    parts = _split_path(path)
    if not parts:
        raise MomentError(f"--set {spec!r}: empty path")
    cur: Any = data
    for key in parts[:-1]:
        cur = _step(cur, key, spec)
    last = parts[-1]
    if append:
        target = _step(cur, last, spec) if not (isinstance(cur, dict) and last not in cur) else None
        if target is None:
            cur[last] = target = []
        if not isinstance(target, list):
            raise MomentError(f"--set {spec!r}: {path} is not a list")
        target.append(value)
    elif isinstance(cur, dict):
        cur[last] = value
    elif isinstance(cur, list):
        item = _step(cur, last, spec)
        idx = cur.index(item)
        cur[idx] = value
    else:
        raise MomentError(f"--set {spec!r}: cannot set a field of {type(cur).__name__}")
