"""One rank of tests/test_train.py's exit test, run under torchrun (gloo): trains through the real
`moment.train` entry, then records which threads are left once it has returned, as JSON.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/exit_ranks.py OUT TRAIN-ARGS...

Why: a process group still alive at interpreter shutdown can abort a finished rank (see
moment.runtime.dist.import_before_group); a rank's threads after `train()` show whether it was.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from moment.runtime.config import parse_args
from moment.runtime.train import train


def thread_names() -> list[str]:
    task = Path("/proc/self/task")
    return sorted((task / t / "comm").read_text().strip() for t in os.listdir(task))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    train(parse_args(sys.argv[2:]))
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"threads": thread_names()}))
