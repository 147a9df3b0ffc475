"""`moment version`: the version and which native parts this installation runs on."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version

import typer

from moment.cli import app, console

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def native_report() -> dict:
    """Which DDAK kernel, sampler loops and I/O engines this installation has, and why one is missing."""
    from moment.io import available_backends
    from moment.placement._native import ddak_library
    from moment.workload.batch_bytes import native_sampling

    try:
        ver = version("moment")
    except PackageNotFoundError:  # a source tree run without installing
        ver = "unknown (not installed)"
    lib, where = ddak_library()
    return {
        "version": ver,
        "ddak": {"engine": "native" if lib is not None else "numpy", "detail": where},
        "sampler": ({"engine": "native", "detail": f"package build ({sampling.__file__})"}
                    if (sampling := native_sampling()) is not None else
                    {"engine": "torch", "detail": "not built (no C compiler when installed): the same batches, slower"}),
        "io_backends": {name: ("usable" if not why else why) for name, why in available_backends().items()},
    }


@app.command("version")
def version_cmd(json_out: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Print Moment's version and whether the native DDAK kernel, sampler loops and I/O engines are in use.

    A build without a C compiler still works (NumPy DDAK, torch sampler loops, Python I/O engine) but is slower; this
    says which one you have and why.
    """
    rep = native_report()
    if json_out:
        print(json.dumps(rep, indent=2))
        return
    console.print(f"moment {rep['version']}", highlight=False)
    console.print(f"DDAK kernel: {rep['ddak']['engine']} — {rep['ddak']['detail']}", highlight=False)
    console.print(f"sampler loops: {rep['sampler']['engine']} — {rep['sampler']['detail']}", highlight=False)
    for name, state in rep["io_backends"].items():
        console.print(f"I/O backend {name}: {state}", highlight=False)
