"""torchrun's agent as `moment train` starts it: torch.distributed.run's own `main` (what the `torchrun` command
runs), with the same arguments, then an exit that does not collect torch's objects once more
(`moment.gcpause.freeze_for_exit`). The agent is the last process of a run to end, so its exit is the run's:
0.52 s after its exit handlers as `python -m torch.distributed.run`, 0.11 s frozen.

Its ranks of `-m moment.train` are forked from it, not started as fresh interpreters: the agent first imports
what each rank would import again (torch, the runtime, torch._dynamo), so a rank starts with it loaded, and the
pages it did not write stay shared with the agent. torchrun's own function entrypoints (its `--run-path`) start
ranks this way; the start method is `fork`. Measured on 2 cores (docs/training.md): a 2-rank GAT launch on the
100k layout 4.9 -> 3.9 s and 7.3 -> 4.6 CPU-s, equal loss curves; the 8M bench's machine peak 2,623 -> 2,350 MiB. The agent never initializes CUDA (its imports only; torch asked to
check for GPUs through NVML, which forks safely), so each forked rank sets up its own device as before.
Any other program runs as torchrun runs it."""

import os
import signal
import sys

# Imports inside functions: torch and the runtime load in the agent's process alone, and only for its ranks.

#: the command line that starts the agent (torchrun's options and the rank's program follow)
COMMAND = [sys.executable, "-m", "moment.runtime.agent"]
#: the program whose ranks are forked from the agent (what `moment train` and `moment doctor --gpu` run)
RANK_MODULE = "moment.train"


def rank(*argv: str) -> None:
    """A forked rank: `python -u -m moment.train ARGV` without the new interpreter."""
    from moment.runtime.train import main

    for sig in signal.valid_signals():  # the handlers torchrun set in the agent (its SIGTERM raises): a fresh
        handler = signal.getsignal(sig)  # interpreter's instead, so that torchrun's SIGTERM ends this rank
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    sys.argv = [os.path.join(os.path.dirname(os.path.dirname(__file__)), "train.py"), *argv]
    for stream in (sys.stdout, sys.stderr):  # -u, as torchrun starts a rank
        if stream is not None:
            stream.reconfigure(write_through=True)
    sys.exit(main(list(argv)))


def forked_ranks(config_from_args):
    """torchrun's `config_from_args`, with `-m moment.train`'s ranks forked from this process (`rank`)."""

    def config(args):
        cfg, cmd, cmd_args = config_from_args(args)
        if args.module and args.training_script == RANK_MODULE and not args.run_path:  # (-m with --no-python: refused)
            import gc

            import moment.runtime.train  # noqa: F401 - what a rank loads first
            from moment.runtime.models import load_optimizers

            load_optimizers()
            gc.freeze()  # the collector of a forked rank does not write to (copy) the pages of what is loaded here
            cfg.start_method = "fork"
            return cfg, rank, list(args.training_script_args)
        return cfg, cmd, cmd_args

    return config


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before torch: a check never initializes CUDA
    import torch.distributed.run as torchrun

    from moment.gcpause import freeze_for_exit

    torchrun.config_from_args = forked_ranks(torchrun.config_from_args)
    try:
        torchrun.main()
    finally:
        freeze_for_exit()
