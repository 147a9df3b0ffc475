"""A request's work in a worker process of its own: past the deadline the process is killed (the work
stops, wherever it is), and its address space is capped (RLIMIT_AS), so one request can neither outlive
its time limit nor grow the service until the kernel's OOM killer stops it. The answer comes back as
plain data (JSON-able) over a pipe; a MomentError comes back as one, a MemoryError as TooLarge."""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable
from typing import Any

from moment.errors import MomentError
from moment.planner.requests import ClusterPlanRequest, cluster_plan
from moment.service.deadline import Searches
from moment.service.errors import Busy, TimedOut, TooLarge, request_field
from moment.topology.profiles import load_profile

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.


def run_capped(fn: Callable[..., Any], args: tuple, seconds: float, what: str, max_bytes: int,
               searches: Searches | None = None) -> Any:
    """`fn(*args)` (a module-level function: it is imported in the worker) in a spawned process holding
    one of the `searches` slots, its address space at most `max_bytes`; TimedOut after `seconds` (the
    process is killed), TooLarge when it runs out of memory, Busy when no slot frees up in time."""
    t0 = time.monotonic()
    if searches is not None and not searches.slots.acquire(timeout=seconds):
        raise Busy(f"the service is busy with other searches; {what} found no free slot within {seconds:g} s, "
                   "try again later")
    ctx = multiprocessing.get_context("spawn")  # never fork a threaded server
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, max_bytes), name=f"moment-{what}", daemon=True)
    try:
        proc.start()
        send.close()
        if not recv.poll(max(0.0, seconds - (time.monotonic() - t0))):
            raise TimedOut(f"{what} did not finish within the service's limit of {seconds:g} s; ask for fewer "
                           "devices or a smaller machine, or run `moment` on the command line for long searches")
        try:
            kind, value = recv.recv()
        except EOFError:  # it died without an answer: a crash, or native code out of memory
            proc.join(5)
            kind, value = "died", proc.exitcode
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
        if searches is not None:
            searches.slots.release()
    if kind == "ok":
        return value
    if kind == "memory":
        raise TooLarge(f"{what} needed more than the service's memory limit of {max_bytes >> 20:,} MiB per request; "
                       "ask for fewer or smaller machines, or run `moment` on the command line")
    if kind == "died":
        raise TooLarge(f"{what} stopped without an answer (exit {value}), as work does past the service's memory "
                       f"limit of {max_bytes >> 20:,} MiB per request; ask for fewer or smaller machines, or run "
                       "`moment` on the command line")
    message, hint, field = value
    raise MomentError(message, hint=hint, field=field)


def _child(conn, fn, args, max_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))
    try:
        conn.send(("ok", fn(*args)))
    except MemoryError:
        conn.send(("memory", None))
    except MomentError as e:
        conn.send(("error", (str(e).split("\n  hint: ")[0], e.hint, e.field)))
    finally:
        conn.close()


def plan_cluster_json(req: dict) -> dict:
    """`POST /v1/plan/cluster`'s work, in the worker: `cluster_plan` of the library's request (its cluster a
    checked spec, whose servers name built-in profiles) as JSON."""
    from moment.service.machines import builtin_profile_path

    result = cluster_plan(ClusterPlanRequest.model_validate(req), flag=request_field,
                          load=lambda name: load_profile(str(builtin_profile_path(name))))
    return result.model_dump(mode="json")
