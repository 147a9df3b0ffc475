"""One large server or several smaller ones: `moment advise --machines-max K`.

For k = 1..K servers of the same chassis under the same total budget, each server gets what
`advise` recommends for its share of the budget (the budget / k, less its NICs and switch ports)
among the inventories that leave slots for its NICs (`advise(reserve=...)`),
and the k servers are planned as a cluster (`moment.planner.cluster`: NICs beside the GPUs they
serve, the epoch with remote feature reads and the all-reduce added). The cluster's TCO is k
servers' TCO plus their NICs and switch ports (price and power, Hyperion's TCO terms); its
throughput is the workload's training seeds per cluster epoch. Of each k's advised inventories
(best per dollar, best throughput, runner-ups) the one with the most samples/s per TCO dollar as a
cluster stands for that k. One server needs no network: k = 1 is `advise`'s own pick.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from moment.cost.advisor import AdviseResult, Candidate, advise
from moment.cost.model import CostParams, energy_kwh, samples_per_epoch
from moment.cost.prices import PriceTable
from moment.errors import Flag, MomentError, cli_flag
from moment.topology.cluster import (
    DEFAULT_NIC,
    MAX_MACHINES,
    MAX_NICS,
    MAX_SWITCH_GBIT,
    ClusterSpec,
    NetworkSpec,
    ServerSpec,
)
from moment.topology.devices import find_model
from moment.topology.model import A_KIND, Kind, Topology
from moment.workload.spec import WorkloadSpec

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.


class MachinesOption(BaseModel):
    """k servers of the chassis, each with the same inventory, joined by a network."""

    machines: int
    inventory: str | None = Field(description="each server's GPUs and SSDs (null: the budget buys nothing at this k)")
    nic: str | None = Field(None, description="NIC model (null for one server)")
    nics_per_server: int = 0
    epoch_s: float | None = None
    read_s: float | None = Field(None, description="the slowest server's local read time")
    network_s: float | None = Field(None, description="the slowest server's remote features + all-reduce")
    network_share: float | None = None
    throughput_samples_per_s: float | None = None
    hardware_usd: float | None = Field(None, description="k servers with their devices, NICs and switch ports")
    network_usd: float | None = Field(None, description="the NICs and switch ports among them")
    tco_usd: float | None = None
    tpc: float | None = Field(None, description="samples/s per TCO dollar")
    best: bool = Field(False, description="the most samples/s per TCO dollar of the options")
    note: str = ""


def check_machines_max(k: int | None, flag: Flag = cli_flag) -> None:
    """1..MAX_MACHINES servers: the cluster file's bound (the largest single switch), since each k is a cluster."""
    if k is not None and not 1 <= k <= MAX_MACHINES:
        raise MomentError(f"{flag('machines_max')} {k}: give 1 to {MAX_MACHINES} servers (the most one switch's "
                          "ports join, as in a cluster file)", field="machines_max")


def check_network(machines_max: int | None, nic: str | None, nics: int | None, switch_gbit: float | None,
                  flag: Flag = cli_flag) -> None:
    """The network options mean something only with machines_max (a flag that does nothing is refused), and are
    in the cluster file's ranges."""
    given = [name for name, v in (("nic", nic), ("nics", nics), ("switch_gbit", switch_gbit)) if v is not None]
    if machines_max is None:
        if given:
            raise MomentError(f"{flag(given[0])} prices the network between servers, which only "
                              f"{flag('machines_max')} compares: add {flag('machines_max')} K or drop "
                              f"{flag(given[0])}", field=given[0])
        return
    check_machines_max(machines_max, flag)
    if nics is not None and not 1 <= nics <= MAX_NICS:
        raise MomentError(f"{flag('nics')} {nics}: give 1 to {MAX_NICS} NICs per server", field="nics")
    if switch_gbit is not None and not 0 < switch_gbit <= MAX_SWITCH_GBIT:
        raise MomentError(f"{flag('switch_gbit')} {switch_gbit:g}: give the switch's port rate in Gb/s, above 0 "
                          f"and at most {MAX_SWITCH_GBIT:g} (e.g. 100)", field="switch_gbit")


def _network_cost(prices: PriceTable, nic: str, nics: int, ports: int, switch_gbit: float, params: CostParams,
                  flag: Flag) -> tuple[float, float]:
    """(hardware USD, electricity USD over the horizon) of one server's NICs and their switch ports."""
    card = prices.device(nic, flag)
    port = prices.switch_port(switch_gbit, flag)
    hw = nics * (card.price_usd + ports * port.price_usd)
    power = nics * (card.power_w + ports * port.power_w)
    return hw, energy_kwh(power, params) * prices.electricity.usd_per_kwh


def compare_machines(topo: Topology, budget_usd: float, machines_max: int, single: AdviseResult, *,
                     nic: str = DEFAULT_NIC, switch_gbit: float | None = None, ports: int = 1, nics: int = 1,
                     prices: PriceTable, params: CostParams, workload: WorkloadSpec | None = None,
                     advise_args: dict | None = None, flag: Flag = cli_flag,
                     progress: Callable[[int, int], None] | None = None) -> list[MachinesOption]:
    """The options for 1..machines_max servers (module docstring); `single` is advise's answer for one
    server under the whole budget, `advise_args` what it was given (models, max_gpus, max_ssds, top_k)."""
    check_machines_max(machines_max, flag)
    wl = workload or WorkloadSpec()
    model = find_model(nic)
    if model.kind != Kind.nic:
        raise MomentError(f"{flag('nic')} {nic}: {model.name} is {A_KIND[model.kind]}, not a NIC", field="nic")
    rate = switch_gbit if switch_gbit is not None else model.port_gbit
    best1 = single.best_throughput_per_dollar
    out = [MachinesOption(machines=1, inventory=best1.inventory, epoch_s=best1.epoch_s,
                          read_s=best1.predicted.epoch_read_s, network_s=0.0, network_share=0.0,
                          throughput_samples_per_s=best1.throughput_samples_per_s, hardware_usd=best1.hardware_usd,
                          network_usd=0.0, tco_usd=best1.tco_usd, tpc=best1.tpc)]
    net_hw, net_ele = _network_cost(prices, model.name, nics, ports, rate, params, flag) if machines_max > 1 else (0, 0)
    for k in range(2, machines_max + 1):
        if progress is not None:
            progress(k - 2, machines_max - 1)
        share = budget_usd / k - net_hw
        if share <= 0:  # so for every larger k: one row says so, and the search ends
            out.append(MachinesOption(machines=k, inventory=None, nic=model.name, nics_per_server=nics, note=(
                f"{k} servers or more: each one's network ({nics} x {model.name} and its switch ports, "
                f"{net_hw:,.0f} USD) costs more than its share of the budget ({budget_usd / k:,.0f} USD)")))
            break
        try:
            res = advise(topo, share, prices=prices, params=params, workload=wl, flag=flag,
                         reserve=((model.name, nics),), **(advise_args or {}))
        except MomentError as e:
            more = e.field == "budget" and k < machines_max  # a smaller share buys no more: the search ends
            out.append(MachinesOption(machines=k, inventory=None, nic=model.name, nics_per_server=nics,
                                      note=f"{k} servers{' or more' if more else ''}, {share:,.0f} USD each: "
                                           f"{str(e).splitlines()[0]}"))
            if more:
                break
            continue
        best: MachinesOption | None = None
        seen: set[str] = set()
        for c in (res.best_throughput_per_dollar, res.best_throughput, *res.runner_ups):
            if c.inventory in seen:
                continue
            seen.add(c.inventory)
            opt = _as_cluster(c, k, model.name, nics, ports, rate, topo, wl, net_hw, net_ele)
            if opt is not None and (best is None or (opt.tpc, -opt.hardware_usd) > (best.tpc, -best.hardware_usd)):
                best = opt
        out.append(best or MachinesOption(machines=k, inventory=None, nic=model.name, nics_per_server=nics,
                                          note=f"no advised inventory leaves a free slot for {nics} x {model.name}"))
    if progress is not None:
        progress(machines_max - 1, machines_max - 1)
    top = max((o for o in out if o.tpc is not None), key=lambda o: (o.tpc, -o.machines))
    return [o.model_copy(update={"best": o is top}) for o in out]


def _as_cluster(c: Candidate, k: int, nic: str, nics: int, ports: int, rate: float, topo: Topology,
                wl: WorkloadSpec, net_hw: float, net_ele: float) -> MachinesOption | None:
    """k servers of advised inventory `c`, planned and priced as a cluster (None: its NICs do not fit)."""
    from moment.planner.cluster import plan_cluster

    inv = ",".join(f"{i.count}x{i.model}" for i in c.items)
    spec = ClusterSpec(servers=[ServerSpec(name="s", profile=topo.name, inventory=inv, nics=nics, count=k)],
                       network=NetworkSpec(nic=nic, ports=ports, switch_gbit=rate))
    try:
        cp = plan_cluster(spec, wl, load=lambda _: topo)
    except MomentError:
        return None  # e.g. no free slot left for the NIC beside this inventory
    slow = next(m for m in cp.machines if m.name == cp.slowest)
    hw = k * (c.hardware_usd + net_hw)
    tco = k * (c.tco_usd + net_hw + net_ele)
    thr = samples_per_epoch(wl) / cp.epoch_s
    return MachinesOption(machines=k, inventory=c.inventory, nic=nic, nics_per_server=nics, epoch_s=cp.epoch_s,
                          read_s=slow.read_s, network_s=slow.network_s, network_share=slow.network_share,
                          throughput_samples_per_s=thr, hardware_usd=hw, network_usd=k * net_hw, tco_usd=tco,
                          tpc=thr / tco)
