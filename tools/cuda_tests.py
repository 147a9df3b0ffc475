"""The CUDA layer's map for developers: which modules of the package have CUDA-only lines, and the tests of
this repository that run them where CUDA exists.

Why here, not in the package: the map names repository files (tests/), which an installed wheel does not
have. `moment doctor --gpu` reads this file from a clone to run those tests; tests/test_cuda_layer.py fails
when another module gains a CUDA-only line, so the layer stays thin and listed; docs/cuda.md says line by
line what each one does.

    python tools/cuda_tests.py          # run the CUDA tests (they skip without CUDA)
    python tools/cuda_tests.py --list   # print them
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SELF_TEST = "tests/test_gpucheck.py"  # runs `moment doctor --gpu`'s checks: not among the tests they run
#: every module with CUDA-only lines (a call to `torch.cuda`, a branch on the device type or the NCCL backend,
#: pinned memory, `record_stream`) -> the tests that run those lines where CUDA exists
CUDA_LAYER: dict[str, tuple[str, ...]] = {
    "moment/io/device.py": ("tests/test_device.py",),
    "moment/io/probe.py": ("tests/test_probe.py",),
    "moment/runtime/checkpoint.py": ("tests/test_cuda_layer.py",),
    "moment/runtime/devices.py": ("tests/test_cuda_layer.py",),
    "moment/runtime/dist.py": ("tests/test_cuda_layer.py", "tests/test_peers.py"),
    "moment/runtime/gpucheck.py": (SELF_TEST,),
}
#: tests with a CUDA side for code that has no CUDA-only line (it runs on both devices): the store's rows
#: through pinned staging, the row exchange on NCCL, the NaN guard without a host sync
CUDA_TOO = ("tests/test_exchange.py", "tests/test_store.py", "tests/test_finite.py")
SLOW_TEST_S = 120  # no CUDA test takes a tenth of this (39 s for all of them on an H200)


def files() -> list[str]:
    """The test files to run on a CUDA machine, relative to the repository."""
    return sorted({t for ts in CUDA_LAYER.values() for t in ts} - {SELF_TEST} | set(CUDA_TOO))


def command(python: str = sys.executable) -> list[str]:
    # quiet once: the repository's addopts has -q, and a second one leaves out pytest's count line. A test still
    # running after SLOW_TEST_S has its stacks dumped on stderr, so a hang names its test (the doctor reads it)
    return [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
            "-o", f"faulthandler_timeout={SLOW_TEST_S}", *files()]


if __name__ == "__main__":
    if "--list" in sys.argv[1:]:
        print("\n".join(files()))
        sys.exit(0)
    sys.exit(subprocess.call(command(), cwd=Path(__file__).resolve().parents[1]))
