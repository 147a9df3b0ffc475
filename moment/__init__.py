"""Moment: plan and run multi-GPU out-of-core GNN training.

`moment.open_run(layout, ...)` opens the out-of-core store and pipelined loader for your own training loop
(moment.runtime.run; needs the `train` extra). Importing `moment` itself imports no torch: the planner and
topology tools run without it.
"""

from typing import Any

# Imports inside functions: `import moment` stays torch-free: `open_run` loads the runtime when first used.

__version__ = "0.1.0"
__all__ = ["open_run", "Run", "Batch", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: only a training script pays for torch
    if name in ("open_run", "Run", "Batch"):
        from moment.runtime import run

        return getattr(run, name)
    raise AttributeError(f"module 'moment' has no attribute {name!r}")
