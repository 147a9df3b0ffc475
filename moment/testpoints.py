"""Named points where a test can crash or pause a real process (fault injection); no-ops otherwise.

    MOMENT_TEST_CRASH_AT=<point>   the process SIGKILLs itself at <point> (no clean-up, like `kill -9`)
    MOMENT_TEST_PAUSE_AT=<point>   at <point> the process creates the file $MOMENT_TEST_PAUSE_FILE and
                                   waits (up to 120 s) until the test deletes it

Points: `locked` (an output lock was just taken: `moment place`, `moment data synth/import`,
`moment layout rm`), and the commit steps of a layout write (see moment.placement.layout):
`layout-written`, `layout-shards-renamed`, `layout-swapped`, `layout-old-shards-removed`, and
`layout-old-moved` (only where the file system cannot swap directories atomically); of a dataset write
(moment.workload.graph): `dataset-written` (complete in its temporary directory) and
`dataset-old-moved` (the dataset it replaces moved aside, the new one not yet in place).
Base level: every layer may import it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_ENV = "MOMENT_TEST_CRASH_AT"
PAUSE_ENV = "MOMENT_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "MOMENT_TEST_PAUSE_FILE"


def reach(point: str) -> None:
    """Crash or pause here if a test asked for it through the environment."""
    if os.environ.get(CRASH_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_ENV) == point and os.environ.get(PAUSE_FILE_ENV):
        flag = Path(os.environ[PAUSE_FILE_ENV])
        flag.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
