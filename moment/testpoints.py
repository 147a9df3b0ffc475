"""Named points where a test can crash or pause a real process (fault injection); no-ops otherwise.

    MOMENT_TEST_CRASH_AT=<point>   the process SIGKILLs itself at <point> (no clean-up, like `kill -9`)
    MOMENT_TEST_PAUSE_AT=<point>   at <point> the process creates the file $MOMENT_TEST_PAUSE_FILE and
                                   waits (up to 120 s) until the test deletes it
    MOMENT_TEST_ENOSPC_AT=<point>[:<n>]  from the n-th time (default: the first) the process reaches
                                   <point>, it fails there as on a full disk (OSError ENOSPC)

Points: `locked` (an output lock was just taken: `moment place`, `moment data synth/import`,
`moment layout rm`), and the commit steps of a layout write (see moment.placement.layout):
`layout-written`, `layout-shards-renamed`, `layout-swapped`, `layout-old-shards-removed`, and
`layout-old-moved` (only where the file system cannot swap directories atomically); of a dataset write
(moment.workload.graph): `dataset-written` (complete in its temporary directory) and
`dataset-old-moved` (the dataset it replaces moved aside, the new one not yet in place); and
`checkpoint-write` (a training checkpoint's bytes are about to be written).
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

_reached: dict[str, int] = {}


def reach(point: str) -> None:
    """Crash, pause or fail here if a test asked for it through the environment."""
    _reached[point] = _reached.get(point, 0) + 1
    full, _, nth = os.environ.get(ENOSPC_ENV, "").partition(":")
    if full == point and _reached[point] >= int(nth or 1):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_ENV) == point and os.environ.get(PAUSE_FILE_ENV):
        flag = Path(os.environ[PAUSE_FILE_ENV])
        flag.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
