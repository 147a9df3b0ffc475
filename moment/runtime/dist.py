"""torch.distributed set-up from torchrun's environment (env://), and the few collectives we use.

Why the environment: torchrun (standalone or with --nnodes/--rdzv-endpoint) hands every rank its
RANK, WORLD_SIZE, MASTER_ADDR/PORT; nothing here picks a port (see `_attempt_store` for the one
thing added on top of env://). Under `moment train --nnodes N` the ranks number themselves by machine
(moment.runtime.rendezvous: rank = node rank x ranks per machine + local rank). Without torchrun (no
WORLD_SIZE, or 1) the run is a plain single process and every collective is a no-op.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from moment.errors import MomentError
from moment.runtime import collective_trace
from moment.runtime.devices import RankDevice, default_device, local_devices
from moment.runtime.exchange import ExchangeGroup
from moment.runtime.lost import WAITING, peer_loss
from moment.runtime.rendezvous import NNODES_ENV, NODE_RANK_ENV, UNKNOWN, RankFacts, machine_ranks

# Imports inside functions: torch's compiler stack (torch._dynamo) loads only before a process group is made.


class AgreedError(MomentError):
    """An error every rank raises alike (the same options, or a decision the ranks took together): rank 0
    says it for all of them, so N ranks print one message, not N."""

    @classmethod
    def of(cls, e: MomentError) -> AgreedError:
        return e if isinstance(e, AgreedError) else cls(str(e))


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group
    serves: RankDevice | None = None  # the plan GPUs this rank serves and how its device was chosen
    groups: list[ExchangeGroup] = field(default_factory=list, repr=False)  # made by peer_group, released at close
    nnodes: int = 1  # machines in the run
    node_rank: int = 0  # this rank's machine (rank // local_world_size)
    node_group: Any = field(default=None, repr=False)  # this machine's ranks (several machines, several ranks each)
    owns_group: bool = True  # made the process group (False: the caller's script had, and destroys it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def restart_count(self) -> int:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)

    # Every collective below runs under `peer_loss`: a rank whose process is gone (it failed, or its script ended
    # without run.close()) is one MomentError on the others, as in the feature exchange, not gloo's or NCCL's
    # "Connection closed by peer" from wherever the run next meets it (close, memory, a loss check, a write).

    def barrier(self) -> None:
        if self.backend:
            with peer_loss(WAITING):
                dist.barrier()

    def local_barrier(self) -> None:
        """This machine's ranks wait for each other (a shared segment is made before they map it). Not the
        world's barrier: whether a machine's ranks share a segment is that machine's own decision."""
        if not self.backend or self.local_world_size < 2:
            return
        with peer_loss(WAITING):
            if self.nnodes == 1:
                dist.barrier()
            else:
                dist.barrier(group=self.node_group)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if not self.backend:
            return t
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        x = t.to(dev)
        with peer_loss(WAITING):
            dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return x.to(t.device)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (the others' are ignored)."""
        if not self.backend:
            return obj
        box = [obj if self.is_main else None]
        with peer_loss(WAITING):
            dist.broadcast_object_list(box, src=0, device=self.device if self.backend == "nccl" else None)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.backend:
            return [obj]
        out: list[Any] = [None] * self.world_size
        with peer_loss(WAITING):
            dist.all_gather_object(out, obj)
        return out

    def peer_group(self) -> ExchangeGroup | None:
        """The ranks of this node (node = rank // local_world_size, as torchrun numbers them): the peer tier's
        exchange; None without a process group or peers. Its rounds run on the world group (one communicator
        for every collective of a rank: moment.runtime.exchange), so nothing is created here."""
        if not self.backend or self.local_world_size < 2:
            return None
        lws = self.local_world_size
        node = self.rank // lws
        return self._exchange(tuple(range(node * lws, min(node * lws + lws, self.world_size))))

    def remote_group(self) -> ExchangeGroup | None:
        """The ranks with this rank's local rank on every machine, in machine order: the remote tier's exchange
        (member j is machine j); None on one machine. Its rounds run on the world group, as the peers'."""
        if not self.backend or self.nnodes < 2:
            return None
        lws = self.local_world_size
        return self._exchange(tuple(m * lws + self.local_rank for m in range(self.nnodes)))

    def _exchange(self, members: tuple[int, ...]) -> ExchangeGroup:
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        self.groups.append(ExchangeGroup(dist.group.WORLD, members, self.rank, dev, self.world_size))
        return self.groups[-1]

    def on_main(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on rank 0 only (a write); its MomentError is raised on every rank as an AgreedError, so
        no rank is left waiting for one that stopped (and seeing only a lost connection)."""
        err = None
        if self.is_main:
            try:
                fn()
            except MomentError as e:
                err = str(e)
        err = self.all_gather_object(err)[0]
        if err is not None:
            raise AgreedError(err)

    def close(self) -> None:
        collective_trace.write(self.rank)
        for g in self.groups:
            g.release()
        node_group, self.node_group = self.node_group, None
        if self.backend and dist.is_initialized() and self.owns_group:
            _retire(dist.group.WORLD, node_group)
            dist.destroy_process_group()


#: The groups this process closed, each held (with when it closed) for `RETIRE_S` more, or until a new group meets or
#: the interpreter exits, whichever comes first (`release_retired`). Why: a model the script wrapped in its own DDP
#: keeps the group it used, and if its reducer drops the group's last reference, gloo's destructor joins its worker
#: threads with the GIL held while a worker, still freeing the tensors of the collective that has just finished,
#: waits for the GIL: the rank hangs for ever (pytorch/pytorch#56297; a rank whose `except MomentError:
#: run.abandon()` freed the model right after the loss check's all-reduce, 3 launches in 55 of tests/open_run_ranks.py
#: on a loaded machine; a loop of open, DDP, collective, close within 15-40 rounds). Held, the last reference is a
#: Python handle's, which releases the GIL as it frees the group, once the workers are idle. Not held longer: the
#: other ranks learn that a rank abandoned the run when its group's connections close (held to the exit, they waited
#: as long as the rank lingered); nor past the exit handlers, where a worker still taking the GIL is ended mid-way.
RETIRE_S = 0.5
_RETIRED: list[tuple[float, Any]] = []
_RETIRING = threading.Lock()
_GROUPS_MADE = itertools.count()  # this process's groups made by `setup`: the n-th on every rank meets as the n-th


def _attempt_store(rank: int, world: int) -> dist.Store:
    """torchrun's store (MASTER_ADDR/PORT from the environment), namespaced by restart attempt and by group.

    Why not plain env://: after a `--max-restarts` restart the agent's store still holds the previous
    attempt's gloo addresses under the same keys, and a fast new rank connects to a dead peer
    (observed with torch 2.13 + gloo). A per-attempt prefix keeps attempts apart. So does the group's
    number within the process: a script that opens a second run after closing the first makes a second
    group in the same attempt, torch numbers it as the first (destroy_process_group resets its count),
    and a rank reading the other's address before that rank rewrote it waited in gloo's connect for ever
    (1 launch in ~30 of tests/open_run_ranks.py's three runs). Every rank opens its runs in the same
    order (each open is collective), so the numbers agree. Where the agents do not
    share their store (`moment train --nnodes`: TORCH_DISABLE_SHARE_RDZV_TCP_STORE, see
    moment.runtime.rendezvous), rank 0 hosts a new one for each round and no prefix is needed: the
    agents' attempt counts differ there (a restart caused by another machine is not counted).
    """
    env = os.environ
    try:
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except KeyError as e:
        raise MomentError(f"WORLD_SIZE={world} but {e.args[0]} is not set: launch with torchrun") from None
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(host, port, world, is_master=(rank == 0 and not agent),
                          timeout=datetime.timedelta(minutes=10), wait_for_workers=False)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0") if agent else "new"
    return dist.PrefixStore(f"moment/attempt_{attempt}/group_{next(_GROUPS_MADE)}", store)


def _machine_rank(store: dist.Store, rank: int, world: int, facts: RankFacts, by_layout: bool = False) -> int:
    """This rank's number by machine (moment.runtime.rendezvous.machine_ranks), agreed through the store before
    the process group exists; the machines' disagreeing flags are one AgreedError on every rank. `by_layout`: the
    node ranks are the split parts' machines (a script's torchrun): where not every machine has one, or they do
    not number the machines, torchrun's own numbers stay, and the run's check of the machines says what is wrong
    (moment.runtime.rendezvous.check_agents: in the layouts' words)."""
    store.set(f"machine/{rank}", facts.encode())
    keys = [f"machine/{r}" for r in range(world)]
    store.wait(keys, datetime.timedelta(minutes=10))
    table = [RankFacts.decode(store.get(k).decode()) for k in keys]
    try:
        return machine_ranks(table)[rank]
    except MomentError as e:
        if by_layout:
            return rank
        _leave_together(store, rank, world)
        raise AgreedError.of(e) from None


READ_ALL_S = 10  # how long the store's host waits for the other ranks to have read the facts, on a refusal


def _leave_together(store: dist.Store, rank: int, world: int) -> None:
    """On a refusal every rank leaves, but rank 0 hosts the store: leaving first, it would cut off a rank still
    reading the facts, whose machine would then say "lost the connection" instead of the reason. Each rank
    says it has read them; rank 0 leaves once all have (or after READ_ALL_S)."""
    try:
        store.add("machine/read", 1)
        end = time.monotonic() + READ_ALL_S
        while rank == 0 and store.add("machine/read", 0) < world and time.monotonic() < end:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the reason is still said on this rank; the store is only a courtesy
        pass


def release_retired(upto: float = math.inf) -> None:
    """Let go of the groups this process closed (those closed by `upto`, a `time.monotonic()`): see `_RETIRED`."""
    with _RETIRING:  # held while the handles go (each joins its group's threads, without the GIL): the exit
        # handler waits for a timer's release in progress, so no group is half-freed as the interpreter finalizes
        _RETIRED[:] = [(t, g) for t, g in _RETIRED if t > upto]


def _retire(*groups: Any) -> None:
    now = time.monotonic()
    with _RETIRING:
        if not _RETIRED:  # one exit handler, registered in this process (a forked rank runs only its own)
            atexit.unregister(release_retired)
            atexit.register(release_retired)
        _RETIRED.extend((now, g) for g in groups if g is not None)
    timer = threading.Timer(RETIRE_S, release_retired, args=(now,))
    timer.daemon = True
    timer.start()


def free_group_last(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a DistributedDataParallel) with its `process_group` attribute moved after its reducer and logger,
    so that when the module is freed, the group's Python handle, not the C++ reducer, lets the group go.

    Why: the reducer's pybind11 handle keeps the GIL while it is freed, and when it holds the group's last
    reference, gloo's destructor joins its worker threads with the GIL held, while a worker may be waiting for the
    GIL to free a collective that has just finished (its thread-local state holds a Python object): a deadlock
    (pytorch/pytorch#56297). A rank whose run ends in an error right after a collective, its model freed with the
    error's frames, met it (tests/open_run_ranks.py's `untracked`: rank 0 hung for ever; a loop of DDP, a
    collective, destroy and free deadlocked within 50 rounds on 2 ranks). The group's own handle releases the GIL
    before it frees the group. (A group the run made is held past its close anyway, `_RETIRED`, whatever DDP the
    script used; this covers a group the script made and destroys itself.)"""
    group = model.__dict__.pop("process_group", None)
    if group is not None:
        model.__dict__["process_group"] = group  # a dict frees its values in insertion order: now the last
    return model


def import_before_group() -> None:
    """Import what DDP and torch-geometric import before the process group exists, so `close()` can really
    destroy it.

    Why: DDP's constructor imports torch._dynamo, which imports torch.distributed.nn.functional, whose
    functions take `group=group.WORLD` as a default argument. Imported after init_process_group, those
    defaults hold the default group forever: destroy_process_group then only unregisters it, and its
    gloo threads live into interpreter shutdown. There a worker thread that drops the last barrier's
    work (which keeps the previous all-gather's tensors, whose Python objects it now owns) must take
    the GIL of a finalizing interpreter; CPython ends the thread with pthread_exit, whose unwinding
    through a noexcept destructor is std::terminate: "terminate called without an active exception",
    SIGABRT in a rank that finished (seen in ~2% of 2-rank runs on a loaded machine; core dumps showed
    this stack). Imported first, those defaults are None (the default group, looked up at each call).
    """
    import torch._dynamo  # noqa: F401


def _place(env: os._Environ | dict[str, str]) -> tuple[int, int, int, int, str]:
    """(world size, rank, local rank, local world size, the launch that made them, for messages): torchrun's
    environment, or the process group a script made without it, whose numbers win. Why: PyG's multi-GPU
    examples start their ranks with `torch.multiprocessing.spawn` and `init_process_group(rank=...)`, which set
    no RANK or WORLD_SIZE; read from the environment alone, every rank was rank 0 of 1, trained every seed and
    took the first GPU. Such a group's ranks are taken as one machine's unless LOCAL_RANK and LOCAL_WORLD_SIZE
    say otherwise."""
    if not (dist.is_available() and dist.is_initialized()):
        world = int(env.get("WORLD_SIZE", "1"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        return (world, int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), local_world,
                f"torchrun --nproc-per-node {local_world}")
    world, rank = dist.get_world_size(), dist.get_rank()
    if "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        local_world = int(env["LOCAL_WORLD_SIZE"])
        return world, rank, int(env["LOCAL_RANK"]), local_world, f"torchrun --nproc-per-node {local_world}"
    return world, rank, rank, world, f"a process group of {world} ranks on this machine (no LOCAL_RANK set)"


def setup(device: str | None = None, gpu_bins: Sequence[tuple[str, str | None]] = (),
          machine: int | None = None) -> DistContext:
    """Init the process group when launched with WORLD_SIZE > 1: NCCL on CUDA, gloo on CPU. `gpu_bins`:
    the layout's (plan GPU, PCI address) pairs; on CUDA each rank takes the device of its plan GPU. `machine`:
    the index of the split's machine whose part this rank opens (None: a whole layout, or none): under a
    script's own torchrun across machines, whose c10d rendezvous ignores --node-rank, the ranks are numbered by
    it (`moment train` says each machine's --node-rank instead)."""
    env = os.environ
    world, rank, local_rank, local_world, launch = _place(env)
    try:  # before the process group: every rank refuses alone, none waits for the others
        serves = local_devices(default_device(device), local_world, gpu_bins, launch)[local_rank]
    except MomentError as e:
        raise AgreedError.of(e) from None
    if serves.device_index is not None:
        dev = torch.device("cuda", serves.device_index)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = None
    if world > 1:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if not dist.is_initialized():
            import_before_group()
            collective_trace.install()
            kw = {"device_id": dev} if dev.type == "cuda" else {}
            store = _attempt_store(rank, world)
            node = env.get(NODE_RANK_ENV, "")
            host = socket.gethostname()
            if node.isdigit():  # `moment train --nnodes`: number the ranks by machine
                rank = _machine_rank(store, rank, world, RankFacts(int(node), int(env.get(NNODES_ENV, "1")),
                                                                   local_rank, local_world, backend, host))
                env["RANK"] = str(rank)  # what this rank is called in its messages
            elif world > local_world:  # a script's torchrun across machines: by the split's parts, where all have one
                rank = _machine_rank(store, rank, world, RankFacts(UNKNOWN if machine is None else machine,
                                                                   world // max(local_world, 1), local_rank,
                                                                   local_world, backend, host), by_layout=True)
                env["RANK"] = str(rank)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, **kw)
            release_retired()
        else:
            rank = dist.get_rank()
    lws = max(local_world, 1)
    ctx = DistContext(rank, local_rank, world, local_world, dev, backend, serves, nnodes=max(world // lws, 1),
                      node_rank=rank // lws)
    if backend and ctx.nnodes > 1 and lws > 1:  # every rank makes every machine's group, at set-up
        ctx.node_group, _ = dist.new_subgroups_by_enumeration([list(range(a, a + lws)) for a in range(0, world, lws)])
    return ctx
