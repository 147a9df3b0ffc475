"""A cluster description: several servers, each a profile and an inventory, joined by a network.

The file is hardware only (what is racked and cabled), so the planner (`moment plan --cluster`), the
cost advisor and a later split of the data over the machines all read the same description:

    name: two-b                       # optional
    servers:
      - name: b                       # optional (default server0, server1, ...)
        profile: paper-machine-b      # built-in name, or a YAML file (relative to this file)
        inventory: 4xA100,8xP5510     # GPUs and SSDs, as `moment plan --inventory`
        nics: 1                       # cards of network.nic in this server (default 1)
        count: 2                      # this many identical servers (default 1)
    network:
      nic: CX6-Dx-100GbE              # NIC model (`moment models`)
      ports: 1                        # ports cabled per NIC (default 1)
      switch_gbit: 100                # the switch's port rate, Gb/s
    remote_fraction: 0.5              # optional: share of the non-replicated rows a machine reads from
                                      # the others (default (N-1)/N: the rows split evenly over N machines)
    model_mb: 2.1                     # optional: gradient bytes all-reduced per step, MB

Validation errors name the field as `servers[0].profile`, `network.switch_gbit`. Every number has a
physical range (MAX_* below, stated in the refusal), integers are strict (`count: true` is refused), and
the machine names a file expands to are checked once for every command (`check_machine_names`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from moment.errors import MomentError, validation_lines
from moment.inputs import exists
from moment.outputs import SPLIT_MANIFEST, SPLIT_OWNERS
from moment.topology.devices import CATALOG, DeviceModel, find_model
from moment.topology.model import A_KIND, Kind

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

# The bounds of a cluster file, in one place (the schema below checks them before any work starts).
#: machines one cluster file may expand to: the plan models one switch, and the largest single switch
#: (51.2 Tb/s) has 512 ports (of 100 Gb/s); it also bounds the work and the answer of a plan
MAX_MACHINES = 512
DEFAULT_NIC = "CX6-Dx-100GbE"  # the NIC of each server where a caller (`advise --machines-max`) names none
MAX_NICS = 16  # NICs of one server: more than a chassis has slots for
MAX_PORTS = 8  # ports of one NIC (catalogue NICs have 1 or 2)
MAX_SWITCH_GBIT = 3200.0  # a switch port's rate, Gb/s (today's fastest is 800)
MAX_MODEL_MB = 1e6  # gradient MB all-reduced per step: 1 TB, past any model a GPU trains
MAX_NAME = 64  # characters of a machine name: it names a directory (a split's layout)
#: what a machine name may hold (it names the machine's layout directory)
MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: the names a split layout's own files take in its directory, beside the machines' layouts
SPLIT_FILES = (SPLIT_MANIFEST, SPLIT_OWNERS)


def check_machine_names(names: list[str]) -> None:
    """The names a cluster's machines get (a file's servers expanded, `--machines N`): each a
    directory name of at most MAX_NAME characters, none a split's own file's (`SPLIT_FILES`), no two
    alike. `plan --cluster`, `place --cluster` and the service all ask this one check, so they accept
    and refuse the same files."""
    for n in names:
        if len(n) > MAX_NAME:
            raise MomentError(f"machine name {n[:20]!r}... is {len(n)} characters: at most {MAX_NAME} (it names "
                              "the machine's layout directory)")
        if not MACHINE_NAME.fullmatch(n):
            raise MomentError(f"machine name {n!r}: use letters, digits, '.', '_' and '-' (it names the machine's "
                              "layout directory)")
        if n.lower() in SPLIT_FILES:  # (a case-blind file system too)
            raise MomentError(f"machine name {n!r}: a split layout keeps its own {n.lower()} beside the machines' "
                              "layout directories, so no machine may take that name")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise MomentError(f"two machines are named {n!r}",
                              hint="a server NAME with count N is NAME0 ... NAME(N-1): rename one of them")
        seen.add(n)


def _within(lo: float, hi: float, unit: str, *, above: bool = False):
    """A field's physical range, checked with a message that states it (and the value, shortened)."""

    def check(v):
        if (v <= lo if above else v < lo) or v > hi:
            shown = str(v) if len(str(v)) <= 24 else f"{str(v)[:20]}... ({len(str(v))} digits)"
            span = f"above {lo:g}, at most {hi:g}" if above else f"from {lo:g} to {hi:g}"
            raise ValueError(f"{shown} is out of range: {span} {unit}")
        return v

    return AfterValidator(check)


def _range(lo: float, hi: float, above: bool = False) -> dict:
    """The same range in the JSON schema (OpenAPI) as the check states it."""
    return {"exclusiveMinimum" if above else "minimum": lo, "maximum": hi}


class NetworkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nic: str = Field(description="NIC model of the catalogue (`moment models`), e.g. CX6-Dx-100GbE")
    ports: Annotated[StrictInt, _within(1, MAX_PORTS, "ports")] = Field(
        1, json_schema_extra=_range(1, MAX_PORTS), description="ports of each NIC cabled to the switch")
    switch_gbit: Annotated[float, _within(0, MAX_SWITCH_GBIT, "Gb/s", above=True)] = Field(
        json_schema_extra=_range(0, MAX_SWITCH_GBIT, above=True), description="the switch's rate per port, Gb/s")


class ServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, description="default: server0, server1, ... in file order; "
                             "with count N, NAME0 ... NAME(N-1)")
    profile: str = Field(min_length=1, description="built-in profile name or YAML file (relative to the cluster file)")
    inventory: str = Field(min_length=1, description="GPUs and SSDs as `moment plan --inventory`: 4xA100,8xP5510")
    nics: Annotated[StrictInt, _within(1, MAX_NICS, "NICs")] = Field(
        1, json_schema_extra=_range(1, MAX_NICS), description="NICs of network.nic in this server")
    count: Annotated[StrictInt, _within(1, MAX_MACHINES, "machines (the largest single switch's ports)")] = Field(
        1, json_schema_extra=_range(1, MAX_MACHINES), description="identical servers this entry stands for")


class ClusterSpec(BaseModel):
    """The cluster file's contract (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "cluster"
    servers: list[ServerSpec] = Field(min_length=1, max_length=MAX_MACHINES)
    network: NetworkSpec
    remote_fraction: Annotated[float, _within(0, 1, "(a share of the rows)")] | None = Field(
        None, json_schema_extra=_range(0, 1), description="share of the non-replicated (SSD-served) rows a machine reads from "
        "other machines; default (N-1)/N, the rows split evenly over the N machines")
    model_mb: Annotated[float, _within(0, MAX_MODEL_MB, "MB", above=True)] | None = Field(
        None, json_schema_extra=_range(0, MAX_MODEL_MB, above=True), description="gradient MB all-reduced per step (default: the "
                                   "planner's estimate for a 2-layer GraphSAGE over the workload's features)")

    @model_validator(mode="after")
    def _machines(self) -> ClusterSpec:
        total = sum(s.count for s in self.servers)
        if total > MAX_MACHINES:
            raise ValueError(f"the servers' counts add up to {total:,} machines: at most {MAX_MACHINES} (the "
                             "largest single switch's ports)")
        try:
            check_machine_names([name for name, _ in self.machines()])
        except MomentError as e:
            raise ValueError(str(e).split("\n  hint: ")[0]) from None
        return self

    def machines(self) -> list[tuple[str, ServerSpec]]:
        """One (name, server) per machine, `count` expanded: 'b' with count 2 is b0 and b1; machines of
        unnamed entries are server0, server1, ... in file order."""
        out: list[tuple[str, ServerSpec]] = []
        unnamed = 0
        for s in self.servers:
            for k in range(s.count):
                if s.name is None:
                    out.append((f"server{unnamed}", s))
                    unnamed += 1
                else:
                    out.append((s.name if s.count == 1 else f"{s.name}{k}", s))
        return out

    def nic_model(self) -> DeviceModel:
        return find_model(self.network.nic)


def nic_rate(nic: DeviceModel, ports: int, switch_gbit: float) -> float:
    """bytes/s one NIC moves in one direction over the network: its cabled ports at the lower of the
    port's and the switch's line rate (the PCIe side is the NIC's link, which the planner adds)."""
    return ports * min(nic.port_gbit, switch_gbit) * 1e9 / 8


def _where(loc: tuple) -> str:
    """('servers', 0, 'profile') -> 'servers[0].profile'."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def cluster_from_dict(data: object, source: str, base: Path | None = None) -> ClusterSpec:
    """Validate a parsed cluster file; profiles given as files are made relative to `base` (the file's
    folder). Every error names the field, e.g. 'servers[1].inventory'."""
    if not isinstance(data, dict):
        raise MomentError("a cluster file must be a YAML mapping with servers and network", source=source,
                          hint="see `moment plan --help` for the cluster file's fields")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as e:
        lines = validation_lines(e, limit=1, relabel=lambda loc: [_where(tuple(loc))] if loc else loc)
        raise MomentError(f"invalid cluster file: {lines[0]}", source=source) from None
    try:
        nic = spec.nic_model()
    except MomentError as e:
        raise MomentError(f"network.nic: {str(e).splitlines()[0]}", source=source, hint=e.hint) from None
    if nic.kind != Kind.nic:
        raise MomentError(f"network.nic: {nic.name} is {A_KIND.get(nic.kind, nic.kind.value)}, not a NIC", source=source,
                          hint="NIC models: " + ", ".join(m.name for m in _nics()))
    if spec.network.ports > nic.ports:
        raise MomentError(f"network.ports {spec.network.ports}: {nic.name} has {nic.ports} port"
                          f"{'s' if nic.ports > 1 else ''}", source=source)
    servers = []
    for s in spec.servers:
        p = Path(s.profile)
        if base is not None and not p.is_absolute() and (p.suffix in (".yaml", ".yml") or exists(base / p)):
            s = s.model_copy(update={"profile": str(base / p)})
        servers.append(s)
    return spec.model_copy(update={"servers": servers})


def _nics() -> list[DeviceModel]:
    return [m for m in CATALOG if m.kind == Kind.nic]


def load_cluster(path: str | Path) -> ClusterSpec:
    """A cluster YAML file (another Moment document given instead is named as such)."""
    from moment.documents import mistaken
    from moment.topology.profiles import read_yaml

    p = Path(path)
    data = read_yaml(p, "cluster file")
    if wrong := mistaken(data, "cluster file", str(p)):
        raise wrong
    return cluster_from_dict(data, str(p), p.parent)
