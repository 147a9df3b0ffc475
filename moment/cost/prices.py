"""The price table: what each device model, the server and a kWh cost, with a date and source each.

The table ships as data (`prices.yaml` in this package). A user's file is merged over it entry by
entry, so a file with one quote (`devices: {H100-PCIe-80GB: {price_usd: 27500}}`) changes only that
price; an entry whose price or power the user changes without saying where it came from gets the
user's file as its source, so a report never shows a shipped source next to a user's number.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from moment.documents import mistaken
from moment.errors import Flag, MomentError, cli_flag, validation_lines
from moment.topology.devices import find_model
from moment.topology.model import Kind
from moment.topology.profiles import parse_yaml, read_yaml

SHIPPED = "shipped"  # PriceTable.origin of the table in this package


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    date: str = Field(description="when the price was true, e.g. '2024-01'")
    source: str = Field(min_length=1, description="where the number comes from")


class DevicePrice(_Entry):
    price_usd: float = Field(gt=0, description="purchase price of one card or drive")
    power_w: float = Field(ge=0, description="maximum board power / TDP, charged by the TCO's electricity term")


class ServerPrice(_Entry):
    price_usd: float = Field(ge=0, description="the host without GPUs and SSDs (Hyperion's C_mac)")
    power_w: float = Field(ge=0, description="the host's own draw, without GPUs and SSDs")


class ElectricityPrice(_Entry):
    usd_per_kwh: float = Field(ge=0)


class PriceTable(BaseModel):
    """Prices in USD. `devices` is keyed by the catalogue's model names (see `moment models`)."""

    model_config = ConfigDict(extra="forbid")
    currency: str = "USD"
    server: ServerPrice
    electricity: ElectricityPrice
    devices: dict[str, DevicePrice]
    switch_ports: dict[float, DevicePrice] = Field(
        default_factory=dict, description="one switch port (its share of the switch, and its cable), by port rate in Gb/s")
    origin: str = Field(SHIPPED, description="'shipped', or the shipped table with the user's file merged over it")

    @field_validator("currency")
    @classmethod
    def _usd(cls, v: str) -> str:
        if v != "USD":
            raise ValueError(f"only USD prices are supported, got {v!r}")
        return v

    @field_validator("devices")
    @classmethod
    def _known(cls, v: dict[str, DevicePrice]) -> dict[str, DevicePrice]:
        out = {}
        for name, entry in v.items():
            m = find_model(name)  # MomentError naming the model when the planner does not know it
            out[m.name] = entry  # aliases ('a100') are stored under the catalogue name
        return out

    def device(self, name: str, flag: Flag = cli_flag) -> DevicePrice:
        m = find_model(name)
        if m.name not in self.devices:
            raise MomentError(f"no price for device model {m.name!r}",
                              hint=f"add it to the prices given with {flag('prices')}, e.g. "
                                   f"devices: {{{m.name}: {{price_usd: ..., power_w: ..., date: ..., source: ...}}}}")
        return self.devices[m.name]

    def switch_port(self, gbit: float, flag: Flag = cli_flag) -> DevicePrice:
        """The price of one switch port of `gbit` Gb/s."""
        if gbit not in self.switch_ports:
            known = ", ".join(f"{g:g}" for g in sorted(self.switch_ports)) or "none"
            raise MomentError(f"no price for a {gbit:g} Gb/s switch port (priced: {known})",
                              hint=f"add it to the prices given with {flag('prices')}, e.g. switch_ports: "
                                   f"{{{gbit:g}: {{price_usd: ..., power_w: ..., date: ..., source: ...}}}}")
        return self.switch_ports[gbit]

    def models(self, kind: Kind) -> list[str]:
        """Priced models of a kind, in catalogue order."""
        return [n for n in self.devices if find_model(n).kind == kind]


def shipped_data() -> dict:
    return parse_yaml(resources.files("moment.cost").joinpath("prices.yaml").read_text(), "moment/cost/prices.yaml")


def _validate(data: dict, source: str) -> PriceTable:
    try:
        return PriceTable.model_validate(data)
    except ValidationError as e:
        lines = validation_lines(e, limit=1)
        raise MomentError(f"invalid price table: {lines[0]}", source=source) from None
    except MomentError as e:  # an unknown model name, from find_model
        raise MomentError(f"devices: {str(e).splitlines()[0]}", source=source,
                          hint="price only models `moment models` lists") from None


#: what a user's price file may give (merged over the shipped table, entry by entry): the table's fields but its origin
SECTIONS = tuple(f for f in PriceTable.model_fields if f != "origin")


def _merge(base: dict, user: dict, source: str) -> dict:
    """The user's entries over the shipped ones, field by field; a changed number without its own
    source or date is attributed to the user's file."""
    out = dict(base)
    for key, value in user.items():
        if key not in SECTIONS:
            try:
                model = find_model(str(key)).name
            except MomentError:
                model = None
            raise MomentError(
                f"{key}: not a section of a price table (its sections: {', '.join(SECTIONS)})", source=source,
                hint=f"a device's price goes under devices:, e.g. devices: {{{model}: {{price_usd: 7500, date: 2025-06, "
                     "source: a quote}}" if model else "docs/planning.md shows a price file (quotes.yaml)")
        if key != "currency" and not isinstance(value, dict):
            raise MomentError(f"{key}: expected a mapping, got {type(value).__name__}", source=source)
        if key == "server" or key == "electricity":
            out[key] = _merge_entry(base.get(key, {}), value, source)
        elif key == "devices":
            devices = dict(base.get("devices", {}))
            canon = {find_model(n).name: n for n in devices}
            for name, entry in value.items():
                if not isinstance(entry, dict):
                    raise MomentError(f"devices.{name}: expected a mapping, got {type(entry).__name__}", source=source)
                try:
                    cname = find_model(str(name)).name
                except MomentError as e:
                    raise MomentError(f"devices.{name}: {str(e).splitlines()[0]}", source=source,
                                      hint="price only models `moment models` lists") from None
                devices[cname] = _merge_entry(devices.pop(canon.get(cname, cname), {}), entry, source)
            out["devices"] = devices
        elif key == "switch_ports":
            ports = {float(g): e for g, e in base.get("switch_ports", {}).items()}
            for gbit, entry in value.items():
                if not isinstance(entry, dict):
                    raise MomentError(f"switch_ports.{gbit}: expected a mapping, got {type(entry).__name__}", source=source)
                try:
                    rate = float(gbit)
                except (TypeError, ValueError):
                    raise MomentError(f"switch_ports.{gbit}: key must be the port rate in Gb/s, e.g. 100",
                                      source=source) from None
                ports[rate] = _merge_entry(ports.get(rate, {}), entry, source)
            out["switch_ports"] = ports
        else:
            out[key] = value
    return out


def _merge_entry(base: dict, user: dict, source: str) -> dict:
    merged = {**base, **user}
    if set(user) - {"date", "source"}:
        if "source" not in user:
            merged["source"] = f"user file {source}"
        if "date" not in user:
            merged["date"] = "not given"
    return merged


@functools.cache
def _shipped_server() -> ServerPrice:
    return load_prices().server


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The shipped table, or the shipped table with the YAML file at `path` merged over it."""
    if path is None:
        return _validate(shipped_data(), "moment/cost/prices.yaml")
    p = Path(path)
    data = read_yaml(p, "price file")
    if wrong := mistaken(data, "price file", str(p)):
        raise wrong
    return merge_prices(data, str(p))


def merge_prices(user: object, source: str) -> PriceTable:
    """The shipped table with `user` (a parsed price file: a mapping, or None for nothing) merged over
    it; `source` names where it came from in messages and in the merged entries' sources."""
    if user is None:
        user = {}
    if not isinstance(user, dict):
        raise MomentError("a price file must be a YAML mapping (currency, server, electricity, devices, switch_ports)",
                          source=source)
    if "origin" in user:
        raise MomentError("origin: not a field of a price file (it is set by Moment)", source=source)
    data = _merge(shipped_data(), user, source)
    data["origin"] = f"shipped + {source}"
    return _validate(data, source)


def builtin_gpus_note(prices: PriceTable, models: list[str], flag: Flag = cli_flag) -> str | None:
    """What a chassis' built-in GPUs (`models`, one name per GPU: SXM modules bought with the machine, which no
    inventory lists) do to its figures: with the shipped server price (a host's without GPUs) every hardware, power,
    TCO and per-dollar figure leaves them out, which is said (an HGX box looked several times better per dollar
    than a PCIe server, without a word); a server price of the user's own is taken as the whole machine's."""
    if not models or prices.server != _shipped_server():
        return None
    counts: dict[str, int] = {}
    for name in models:
        counts[name] = counts.get(name, 0) + 1
    what = " + ".join(f"{c} {m}" for m, c in counts.items())
    return (f"hardware, power, TCO and samples/s per dollar leave out the machine's built-in GPUs ({what}): the "
            f"server's price ({prices.server.price_usd:,.0f} USD, {prices.server.power_w:,.0f} W) is a host's "
            f"without GPUs; give the whole machine's with {flag('prices')} (server: {{price_usd: ..., power_w: ..., "
            "date: ..., source: ...})")
