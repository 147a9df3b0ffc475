"""torchrun's agent as `moment train` starts it: torch.distributed.run's own `main` (what the `torchrun` command
runs), with the same arguments, then an exit that does not collect torch's objects once more
(`moment.gcpause.freeze_for_exit`). The agent is the last process of a run to end, so its exit is the run's:
0.52 s after its exit handlers as `python -m torch.distributed.run`, 0.11 s frozen."""

import sys

#: the command line that starts the agent (torchrun's options and the rank's program follow)
COMMAND = [sys.executable, "-m", "moment.runtime.agent"]

if __name__ == "__main__":
    from torch.distributed.run import main

    from moment.gcpause import freeze_for_exit

    try:
        main()
    finally:
        freeze_for_exit()
