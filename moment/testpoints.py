"""Named points where a test can crash or pause a real process (fault injection); no-ops otherwise.

    MOMENT_TEST_CRASH_AT=<point>   the process SIGKILLs itself at <point> (no clean-up, like `kill -9`)
    MOMENT_TEST_EXIT_AT=<point>:<n>  the n-th time the process reaches <point> it exits at once with
                                   status 1 (`os._exit`: no clean-up, like a rank that crashed)
    MOMENT_TEST_PAUSE_AT=<point>   at <point> the process creates the file $MOMENT_TEST_PAUSE_FILE and
                                   waits (up to 120 s) until the test deletes it
    MOMENT_TEST_ENOSPC_AT=<point>[:<n>]  from the n-th time (default: the first) the process reaches
                                   <point>, it fails there as on a full disk (OSError ENOSPC)

Points: `locked` (an output lock was just taken: `moment place`, `moment data synth/import`,
`moment layout rm`, a hotness save); the steps of putting a finished directory in place
(moment.outputs.publish_dir) for each writer W of `dataset`, `hotness`, `pack`, `layout` and `split` (a layout
split over machines, moment.placement.split):
`W-written` (complete under its temporary name), `W-old-moved` (only where the file system cannot swap
directories atomically: the previous version moved aside, the new one not yet in place) and `W-swapped`
(the new version in place, the previous one not yet removed); a layout's own steps
`layout-shards-renamed` and `layout-old-shards-removed` (see moment.placement.layout);
`checkpoint-write` (a training checkpoint's bytes are about to be written); and `train-step` (a
training step is done; counted by the run's own step number, so `MOMENT_TEST_EXIT_AT=train-step:5` stops
one rank after its fifth step and torchrun's restart resumes from a checkpoint).
A point that every rank of a run reaches (`reach_rank`) fires on one of them only, on the run's first
attempt (a restart must get past it):

    MOMENT_TEST_RANK=<r>           the rank it fires on (default: the last rank, RANK = WORLD_SIZE - 1)
Base level: every layer may import it.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

CRASH_ENV = "MOMENT_TEST_CRASH_AT"
PAUSE_ENV = "MOMENT_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "MOMENT_TEST_PAUSE_FILE"
ENOSPC_ENV = "MOMENT_TEST_ENOSPC_AT"
EXIT_ENV = "MOMENT_TEST_EXIT_AT"
RANK_ENV = "MOMENT_TEST_RANK"

_reached: dict[str, int] = {}


def _exit() -> None:
    os._exit(1)


def reach(point: str, count: int | None = None) -> None:
    """Crash, pause or fail here if a test asked for it through the environment. `count`: how many times
    the caller has reached `point` (its own count, e.g. a run's step); by default this process's count."""
    _reached[point] = _reached.get(point, 0) + 1
    n = _reached[point] if count is None else count
    full, _, nth = os.environ.get(ENOSPC_ENV, "").partition(":")
    if full == point and n >= int(nth or 1):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    at, _, nth = os.environ.get(EXIT_ENV, "").partition(":")
    if at == point and n == int(nth or 1):
        _exit()
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_ENV) == point and os.environ.get(PAUSE_FILE_ENV):
        flag = Path(os.environ[PAUSE_FILE_ENV])
        flag.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)


def reach_rank(point: str, count: int | None = None) -> None:
    """`reach` on the rank MOMENT_TEST_RANK names (default: the last) of a run's first attempt; elsewhere nothing."""
    env = os.environ
    if int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return
    last = int(env.get("WORLD_SIZE", "1") or 1) - 1
    if int(env.get("RANK", "0") or 0) == int(env.get(RANK_ENV, "") or last):
        reach(point, count)
