"""Cost: a price table, Hyperion's TCO and throughput-per-cost model, and `advise` (what to buy).

Sits beside the planner and above it (it calls `best_placement`); never imports torch. The names below load
their modules when first used, so a light module of the package (its requests, which the CLI reads at start)
does not load the advisor.
"""

from moment.lazy import exports

#: name -> the module that defines it
EXPORTS = {
    "AdviseResult": "moment.cost.advisor", "Candidate": "moment.cost.advisor", "advise": "moment.cost.advisor",
    "CostParams": "moment.cost.model", "CostReport": "moment.cost.model", "cost_report": "moment.cost.model",
    "PriceTable": "moment.cost.prices", "load_prices": "moment.cost.prices", "merge_prices": "moment.cost.prices",
}
__all__ = sorted(EXPORTS)

__getattr__ = exports(__name__, EXPORTS)
