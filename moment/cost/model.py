"""Hyperion's cost model: hardware cost, energy over the horizon, TCO and throughput per cost (TPC).

From the Hyperion paper:

- Eq. 5 (section VI): TCO = (C_mac + C_gpu x N_gpu + C_ssd x N_ssd + C_ele) x N_mac, over 5 years.
  Moment prices one machine (N_mac = 1) and sums per model, so mixed inventories work.
- C_ele, the electricity over the horizon. Hyperion charges a flat 4,000 W at $0.10/kWh running
  continuously for 5 years and rounds it to $17,000 (4 kW x 43,800 h x $0.10 is $17,520). Moment
  charges what the machine draws: the server's own power plus each card's TDP (from the price
  table), times PUE and a utilisation; `machine_power_w` replaces the sum with a flat figure (set it
  to 4000 to get Hyperion's number).
- Eq. 3 (section III-C): TPC = Bs / (T_batch x cost): training samples per second per dollar. The
  planner predicts an epoch (`Plan.predicted.epoch_read_s`), so throughput = training seeds per
  epoch / epoch seconds, the same samples/s at epoch granularity. Section V-C computes its TPC over
  the five-year TCO; that is `tpc` here, and Eq. 3's hardware-only denominator is `tpc_hardware`.
- Hyperion's T_batch = max(T_ssd, T_pcie, T_train). The planner's epoch time is the I/O part
  (T_ssd, T_pcie: the least time in which every GPU is fed); compute is not modelled, i.e. taken as
  overlapped and shorter, which is the I/O-bound case Hyperion's SSD advice is about.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from moment.cost.prices import PriceTable
from moment.errors import MomentError
from moment.topology.devices import Inventory
from moment.topology.model import A_KIND, Kind

HOURS_PER_YEAR = 365 * 24  # 8,760, as Hyperion's 5-year continuous running implies


class CostParams(BaseModel):
    """The knobs of the TCO that are not prices. Defaults reproduce Hyperion's assumptions."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    years: float = Field(5.0, gt=0, description="horizon of the TCO (Hyperion: 5 years)")
    pue: float = Field(1.0, ge=1.0, description="power usage effectiveness: facility power / IT power "
                       "(Hyperion counts the machine only: 1.0; a data centre is typically 1.3-1.6)")
    utilisation: float = Field(1.0, gt=0, le=1, description="share of the horizon the machine runs at its "
                               "rated power (Hyperion: 1.0, 'runs GPU workloads continuously')")
    machine_power_w: float | None = Field(None, gt=0, description="flat machine power in W instead of server + "
                                          "device TDPs (Hyperion: 4000)")


class LineItem(BaseModel):
    model: str
    kind: str
    count: int
    unit_usd: float
    power_w: float = Field(description="TDP of one")
    date: str
    source: str


class CostReport(BaseModel):
    """A machine's hardware cost, its energy over the horizon, its TCO and its throughput per dollar."""

    inventory: str
    items: list[LineItem]
    server_usd: float = Field(description="the host without GPUs and SSDs (C_mac)")
    hardware_usd: float = Field(description="C_mac + sum of C_gpu x N_gpu and C_ssd x N_ssd: the purchase")
    power_w: float = Field(description="rated draw of the machine (server + device TDPs, or machine_power_w)")
    energy_kwh: float = Field(description="power x PUE x utilisation x hours over the horizon / 1000")
    electricity_usd: float = Field(description="C_ele: energy_kwh x price per kWh")
    tco_usd: float = Field(description="hardware_usd + electricity_usd (Eq. 5, one machine)")
    years: float
    epoch_s: float = Field(description="the plan's predicted epoch time (I/O: every GPU fed)")
    samples_per_epoch: float = Field(description="training seeds per epoch (num_nodes x train_fraction)")
    throughput_samples_per_s: float = Field(description="samples_per_epoch / epoch_s")
    epochs_per_hour: float
    tpc: float = Field(description="samples/s per TCO dollar (Hyperion's TPC over the 5-year TCO)")
    tpc_hardware: float = Field(description="samples/s per hardware dollar (Eq. 3's denominator)")


def line_items(inventory: Inventory, prices: PriceTable) -> list[LineItem]:
    """One line per model of the inventory (a model listed twice is one line), in inventory order."""
    out = []
    for m, c in inventory.merged():
        if m.kind not in (Kind.gpu, Kind.ssd):
            raise MomentError(f"{m.name} is {A_KIND[m.kind]}: the cost model prices GPUs and SSDs only")
        p = prices.device(m.name)
        out.append(LineItem(model=m.name, kind=m.kind.value, count=c, unit_usd=p.price_usd, power_w=p.power_w,
                            date=p.date, source=p.source))
    return out


def hardware_usd(items: list[LineItem], prices: PriceTable) -> float:
    """Hyperion Eq. 5 without C_ele: C_mac + sum of unit price x count."""
    return prices.server.price_usd + sum(i.unit_usd * i.count for i in items)


def machine_power_w(items: list[LineItem], prices: PriceTable, params: CostParams) -> float:
    if params.machine_power_w is not None:
        return params.machine_power_w
    return prices.server.power_w + sum(i.power_w * i.count for i in items)


def energy_kwh(power_w: float, params: CostParams) -> float:
    return power_w * params.pue * params.utilisation * params.years * HOURS_PER_YEAR / 1000.0


def costs(inventory: Inventory, prices: PriceTable, params: CostParams) -> tuple[list[LineItem], float, float, float]:
    """(items, hardware_usd, power_w, tco_usd): everything but the throughput, cheap to compute."""
    items = line_items(inventory, prices)
    hw = hardware_usd(items, prices)
    power = machine_power_w(items, prices, params)
    return items, hw, power, hw + energy_kwh(power, params) * prices.electricity.usd_per_kwh


def report(inventory: Inventory, epoch_s: float, samples_per_epoch: float, prices: PriceTable,
           params: CostParams) -> CostReport:
    """The cost report of an inventory whose epoch takes `epoch_s`."""
    items, hw, power, tco = costs(inventory, prices, params)
    kwh = energy_kwh(power, params)
    thr = samples_per_epoch / epoch_s
    return CostReport(
        inventory=inventory.describe(), items=items, server_usd=prices.server.price_usd, hardware_usd=hw,
        power_w=power, energy_kwh=kwh, electricity_usd=kwh * prices.electricity.usd_per_kwh, tco_usd=tco,
        years=params.years, epoch_s=epoch_s, samples_per_epoch=samples_per_epoch,
        throughput_samples_per_s=thr, epochs_per_hour=3600.0 / epoch_s, tpc=thr / tco, tpc_hardware=thr / hw)


def samples_per_epoch(workload) -> float:
    """Training seeds per epoch: what Hyperion's throughput counts (Bs per batch, batches per epoch)."""
    return workload.num_nodes * workload.train_fraction


def cost_report(plan, inventory: Inventory, prices: PriceTable, params: CostParams | None = None) -> CostReport:
    """The cost report of a plan (`moment.planner.plan.make_plan`) for the inventory it placed."""
    return report(inventory, plan.predicted.epoch_read_s, samples_per_epoch(plan.workload), prices,
                  params or CostParams())
