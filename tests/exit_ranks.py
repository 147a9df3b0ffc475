"""One rank of tests/test_train.py's exit test, run under torchrun (gloo): trains through the real
`moment.train` entry, then records which threads are left at the interpreter's exit (after Moment's exit
handlers, before the interpreter finalizes), as JSON.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/exit_ranks.py OUT TRAIN-ARGS...

Why: a process group still alive at interpreter shutdown can abort a finished rank (see
moment.runtime.dist.import_before_group); a rank's threads then show whether it was.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from moment.runtime.config import parse_args
from moment.runtime.train import train


def thread_names() -> list[str]:
    task = Path("/proc/self/task")
    return sorted((task / t / "comm").read_text().strip() for t in os.listdir(task))


def record(out: Path) -> None:
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"threads": thread_names()}))


if __name__ == "__main__":
    atexit.register(record, Path(sys.argv[1]))  # before train() registers Moment's: runs after them
    train(parse_args(sys.argv[2:]))
