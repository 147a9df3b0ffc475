"""Several `moment.train` runs one after the other in the same ranks, for tests/test_train.py: one torchrun
launch (one torch start-up per rank) where each run would start its own. Each run is `train()` of its own
arguments, as the `moment.train` entry runs it; a run's metrics go where its --metrics-json says.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/train_runs.py '[[TRAIN-ARGS...], ...]'
"""

from __future__ import annotations

import json
import sys

from moment.runtime.config import parse_args
from moment.runtime.train import train

if __name__ == "__main__":
    for args in json.loads(sys.argv[1]):
        train(parse_args(args))
