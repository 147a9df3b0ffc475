"""`moment doctor --gpu`: is this machine ready to train on its GPUs (moment.runtime.gpucheck)."""

from __future__ import annotations

import json

import typer

from moment.cli import app, console
from moment.errors import MomentError

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

DEVICES = ("cuda", "cpu")  # what --device may name (moment.runtime.gpucheck.check_machine)


@app.command("doctor")
def doctor_cmd(
    gpu: bool = typer.Option(False, "--gpu", help="run the GPU checks: the CUDA tests, a pipelined epoch against "
                             "the in-memory one (batches bit for bit, collectives from one thread, each rank on "
                             "its own GPU), the staging ring with delayed copies"),
    device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda where there is one; "
                                      "cpu runs the same comparisons without CUDA)"),
    ranks: int | None = typer.Option(None, "--ranks", help="ranks of the pipelined epoch (default: 2 on CPU, one "
                                     "per CUDA device up to 4)"),
    no_tests: bool = typer.Option(False, "--no-tests", help="leave out the repository's CUDA tests"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Check that this machine is ready to train: run `moment doctor --gpu` first on a GPU machine.

    --gpu is required: the GPU checks are the only ones so far (without it the doctor says so and exits 2).
    With --gpu, where CUDA exists: the repository's CUDA tests; one epoch of a small layout trained with the
    tiered pipelined store against the features-in-memory run on the same device (up to 4 ranks, one per
    GPU, matched by PCI address): every batch bit for bit, the losses within a tolerance, every collective of
    a rank from one thread in one order, each rank holding a CUDA context on its own GPU only; and the pinned
    staging ring with every copy delayed, under torch.cuda.set_sync_debug_mode("warn"). Every check has a
    deadline (a hang fails it). Without CUDA, --gpu says so in one line and exits 0. Exits 1 when a check
    fails; the last line counts what passed, what was skipped (and why) and what failed.

    Example: moment doctor --gpu
    """
    if device is not None and device not in DEVICES:
        raise MomentError(f"--device {device}: not a device the checks run on; choose {' or '.join(DEVICES)}",
                          hint="moment doctor --gpu --device cpu")
    if not gpu:
        raise MomentError("say what to check: --gpu is required (the GPU checks are the only ones so far)",
                          hint="moment doctor --gpu")
    from moment.runtime.gpucheck import check_machine, render

    rep = check_machine(device, tests=not no_tests, ranks=ranks)
    if json_out:
        print(json.dumps(rep.to_json(), indent=2))
    else:
        for line in render(rep):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    if not rep.ok:
        raise typer.Exit(1)
