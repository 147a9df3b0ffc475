"""Build hook for the optional native parts (sources in native/): the I/O engine (moment.io._native),
the DDAK kernel (moment.placement._ddak, loaded through ctypes) and the sampler's per-hop loops
(moment.workload._sampling).

Metadata lives in pyproject.toml; this file only declares the C extensions.  Both are optional: if the
compiler or Python headers are missing, `pip install .` still succeeds, moment.io falls back to its
pure-Python engine, DDAK to its NumPy method and the sampler to its torch path (`moment version` says which are in use).  liburing is used when a test program that includes <liburing.h> links;
the static archive is preferred so the built module does not need liburing at run time.
"""

from __future__ import annotations

import os
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

_PROBE = "#include <liburing.h>\nint main(void){struct io_uring r; return io_uring_queue_init(2,&r,0) < 0;}\n"
# liburing >= 2.3: submit and run deferred completions in one call (older ones submit only)
_PROBE_GET_EVENTS = "#include <liburing.h>\nint main(void){struct io_uring r; return io_uring_submit_and_get_events(&r);}\n"


class BuildExt(build_ext):
    """Adds liburing to the extension when its headers and library are usable with this compiler."""

    def build_extensions(self) -> None:
        libs = self._liburing()
        for ext in self.extensions:
            if ext.name != "moment.io._native":
                continue
            if libs is not None and os.environ.get("MOMENT_NO_LIBURING") != "1":
                ext.define_macros.append(("MOMENT_HAVE_LIBURING", "1"))
                if self._links(_PROBE_GET_EVENTS, libs):
                    ext.define_macros.append(("MOMENT_HAVE_SUBMIT_GET_EVENTS", "1"))
                ext.extra_link_args.extend(libs)
        super().build_extensions()

    def _liburing(self) -> list[str] | None:
        for libs in (["-l:liburing.a"], ["-luring"]):
            if self._links(_PROBE, libs):
                return libs
        return None

    def _links(self, program: str, libs: list[str]) -> bool:
        """Whether `program` compiles and links against `libs` with this compiler."""
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write(program)
            try:
                objs = self.compiler.compile([src], output_dir=tmp)
                self.compiler.link_shared_object(objs, os.path.join(tmp, "probe.so"), extra_postargs=libs)
            except (CompileError, LinkError):
                return False
        return True


setup(
    ext_modules=[
        Extension(
            "moment.io._native",
            sources=["native/moment_io.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-missing-field-initializers"],
            libraries=["pthread"],
            optional=True,
        ),
        Extension(
            "moment.placement._ddak",
            sources=["native/ddak.c"],
            # no fused multiply-add: bit-identical to the Python reference (see native/ddak.c)
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-ffp-contract=off"],
            define_macros=[("MOMENT_DDAK_MODULE", "1")],
            libraries=["m"],
            optional=True,
        ),
        Extension(
            "moment.workload._sampling",
            sources=["native/sampling.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
