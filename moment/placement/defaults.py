"""The defaults of `moment place` that the library's keyword signatures (moment.placement.api) and the typed
request (moment.placement.requests) both take: stated here once, in a module light enough for the request,
which the CLI reads at start, to import without the placement machinery."""

DEFAULTS = {"epochs": 1, "policy": "ddak", "overwrite": False, "verify": True, "seed": 0}
