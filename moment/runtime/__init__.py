"""Train: tiered feature store, pipelined sample -> gather -> train, models, DDP entry point (needs torch).

The public face is `open_run` (moment.runtime.run), also exported as `moment.open_run`."""

from typing import Any

# Imports inside functions: `open_run` loads the runtime (torch) when first used.

__all__ = ["Batch", "Loader", "Run", "open_run"]


def __getattr__(name: str) -> Any:  # lazy: `moment.runtime.budget` and friends are used without torch's cost
    if name in __all__:
        from moment.runtime import run

        return getattr(run, name)
    raise AttributeError(f"module 'moment.runtime' has no attribute {name!r}")
