"""Cost: a price table, Hyperion's TCO and throughput-per-cost model, and `advise` (what to buy).

Sits beside the planner and above it (it calls `best_placement`); never imports torch.
"""

from moment.cost.advisor import AdviseResult, Candidate, advise
from moment.cost.model import CostParams, CostReport, cost_report
from moment.cost.prices import PriceTable, load_prices, merge_prices

__all__ = ["AdviseResult", "Candidate", "CostParams", "CostReport", "PriceTable", "advise", "cost_report",
           "load_prices", "merge_prices"]
