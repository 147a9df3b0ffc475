"""Training across machines: `moment train --nnodes N --node-rank K --rdzv-endpoint HOST:PORT`.

Why this module: torchrun's c10d rendezvous joins the agents, restarts them and tracks membership (no
home-made launcher), but three things are left to us, decided here once and without torch:

* the flags, checked before torchrun starts (a port out of range, a node rank beyond --nnodes, an
  address no machine can reach), each one line naming the flag;
* the arguments torchrun gets (`Rendezvous.torchrun_args`, `Rendezvous.env`): c10d at the endpoint,
  its join timeout, and a store that is new for every round of the rendezvous. torchrun shares one
  store across rounds and numbers attempts per agent, but after a restart caused by another machine an
  agent's count stays behind (membership changes are not counted as its restarts), so attempts could
  not be told apart by their number across machines (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: rank 0 of
  each round hosts a fresh store, see moment.runtime.dist);
* the ranks' numbers: c10d orders agents its own way and ignores --node-rank, so each rank says which
  machine (node rank) it is on through the store and takes rank node_rank x ranks per machine + local
  rank (`machine_ranks`). Rank 0 is then on machine 0: it prints, writes the metrics and the
  checkpoints there, and a restart finds them there. Two machines giving one node rank, different
  --nproc or --nnodes, or CPU and GPU machines mixed are refused, the same way on every rank. A script's own
  torchrun across machines sets no node rank: the ranks on a split's parts say the part's machine instead
  (moment.runtime.dist.setup), and keep torchrun's numbers where a machine cannot say (a whole layout).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from moment.errors import MomentError

NODE_RANK_ENV = "MOMENT_NODE_RANK"  # set by `moment train` for its ranks: this machine's --node-rank
NNODES_ENV = "MOMENT_NNODES"  # and --nnodes
UNKNOWN = -1  # a RankFacts node rank: the machine cannot say (a script's torchrun on a whole layout)
RDZV_ID = "moment"  # the rendezvous id every agent gives (one training per endpoint)
DEFAULT_TIMEOUT_S = 600  # how long an agent waits for the others to join (torchrun's own default)
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_EXAMPLE = "e.g. --rdzv-endpoint 127.0.0.1:29500, or HOSTNAME:29500 of machine 0"


@dataclass(frozen=True)
class Rendezvous:
    nnodes: int
    node_rank: int
    host: str  # as given
    port: int
    timeout_s: int

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """Every agent is on this machine (the endpoint is a loopback address)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def torchrun_args(self) -> list[str]:
        """torchrun's rendezvous arguments (before --nproc-per-node and the program)."""
        out = [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}",
               f"--rdzv-id={RDZV_ID}", f"--rdzv-conf=join_timeout={self.timeout_s}"]
        if self.loopback:  # the agents and their ranks talk over loopback only, never another interface
            out.append("--local-addr=127.0.0.1" if self.host != "::1" else "--local-addr=::1")
        return out

    def env(self) -> dict[str, str]:
        """What the ranks' environment adds (see the module doc)."""
        return {NODE_RANK_ENV: str(self.node_rank), NNODES_ENV: str(self.nnodes),
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def parse_host(host: str) -> str:
    """`host` as given when it is an IP address another process can connect to, or a hostname (RFC 1123)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified or ip.is_multicast or (ip.version == 4 and int(ip) == 0xFFFFFFFF):
            raise MomentError(f"--rdzv-endpoint: {bare} is not an address an agent can connect to",
                              hint=f"give the address or hostname of machine 0 ({_EXAMPLE})")
        return bare
    if len(host) > 253 or not all(_LABEL.fullmatch(p) for p in host.rstrip(".").split(".")) or host.isdigit():
        raise MomentError(f"--rdzv-endpoint: {host!r} is neither an IP address nor a hostname",
                          hint=f"give HOST:PORT ({_EXAMPLE})")
    return host


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """HOST and PORT of `endpoint`, its port checked. Why not split at the last ':': in '127.0.0.1:29400:1' the
    wrong part is the port ('29400:1'), not the host; only a bare IPv6 address ('::1:29500') has colons in it."""
    value = endpoint.strip()
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            raise MomentError(f"--rdzv-endpoint {endpoint!r}: {value!r} opens '[' without its ']'",
                              hint=f"write an IPv6 address as [ADDRESS]:PORT, e.g. [::1]:29500 ({_EXAMPLE})")
        host, rest = value[1:close], value[close + 1:]
        if not rest.startswith(":"):
            raise MomentError(f"--rdzv-endpoint {endpoint!r}: {rest!r} after {value[:close + 1]!r} is not ':PORT'"
                              if rest else f"--rdzv-endpoint {endpoint!r}: no ':PORT' after {value[:close + 1]!r}",
                              hint=f"give [ADDRESS]:PORT, e.g. [::1]:29500 ({_EXAMPLE})")
        port = rest[1:]
    else:
        head, _, tail = value.rpartition(":")
        try:
            bare_ipv6 = ipaddress.ip_address(head).version == 6
        except ValueError:
            bare_ipv6 = False
        # a URL's scheme is part of its (wrong) host: 'http://node0' is what is quoted
        host, sep, port = (head, ":", tail) if bare_ipv6 or "/" in head else value.partition(":")
        if not sep:
            raise MomentError(f"--rdzv-endpoint {endpoint!r}: no ':PORT' (expected HOST:PORT, {_EXAMPLE})")
    if not host:
        raise MomentError(f"--rdzv-endpoint {endpoint!r}: no HOST before ':{port}' (expected HOST:PORT, {_EXAMPLE})")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise MomentError(f"--rdzv-endpoint {endpoint!r}: the port {port!r} is not an integer from 1 to 65535",
                          hint=f"give HOST:PORT ({_EXAMPLE})")
    return host, port


def parse_rendezvous(nnodes: int, node_rank: int | None, endpoint: str | None,
                     timeout_s: int | None = None) -> Rendezvous | None:
    """The rendezvous `moment train` starts (None: one machine, torchrun --standalone), its flags checked."""
    if nnodes < 1:
        raise MomentError(f"--nnodes {nnodes}: must be an integer >= 1")
    if nnodes == 1:
        given = [f for f, v in (("--node-rank", node_rank), ("--rdzv-endpoint", endpoint), ("--rdzv-timeout", timeout_s))
                 if v is not None]
        if given:
            raise MomentError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --nnodes N > 1 "
                              "(training across machines)", hint="on one machine leave them out")
        return None
    if node_rank is None:
        raise MomentError(f"--nnodes {nnodes}: give this machine's --node-rank (0 to {nnodes - 1})")
    if not 0 <= node_rank < nnodes:
        raise MomentError(f"--node-rank {node_rank}: must be 0 to {nnodes - 1} (--nnodes {nnodes})")
    if endpoint is None:
        raise MomentError(f"--nnodes {nnodes}: give --rdzv-endpoint HOST:PORT, the same on every machine ({_EXAMPLE})")
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if timeout_s < 1:
        raise MomentError(f"--rdzv-timeout {timeout_s}: must be an integer >= 1 (seconds)")
    host, port = split_endpoint(endpoint)
    host = parse_host(host)
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise MomentError(f"--rdzv-endpoint {endpoint!r}: cannot resolve {host} ({getattr(e, 'strerror', None) or e})",
                          hint="give machine 0's address, or a hostname every machine resolves") from None
    return Rendezvous(nnodes, node_rank, host, int(port), timeout_s)


def others_gone(node_rank: int, nnodes: int) -> str:
    """Which machine went away, as machine `node_rank` can say it: not itself (it is here to say so). Why: a
    machine that lost its peers used to name the rendezvous host (machine 0), often itself."""
    others = [k for k in range(nnodes) if k != node_rank]
    if len(others) == 1:
        return f"machine {others[0]} stopped or cannot be reached"
    if len(others) <= 6:
        return f"one of machines {', '.join(map(str, others))} stopped or cannot be reached"
    return f"another machine (not this one, machine {node_rank}) stopped or cannot be reached"


@dataclass(frozen=True)
class RankFacts:
    """What a rank tells the others before the process group exists (through torchrun's store)."""

    node_rank: int
    nnodes: int
    local_rank: int
    local_world_size: int
    backend: str  # gloo (CPU) or nccl (CUDA)
    host: str

    def encode(self) -> str:
        return f"{self.node_rank}|{self.nnodes}|{self.local_rank}|{self.local_world_size}|{self.backend}|{self.host}"

    @classmethod
    def decode(cls, text: str) -> RankFacts:
        node, nn, lr, lws, backend, host = text.split("|", 5)
        return cls(int(node), int(nn), int(lr), int(lws), backend, host)


def _machine(f: RankFacts | RunFacts) -> str:
    """How a message names a machine."""
    return f"node {f.node_rank} ({f.host})"


def machine_ranks(facts: list[RankFacts]) -> list[int]:
    """Each rank's number (facts in torchrun's rank order): node_rank x ranks per machine + local rank.
    Raises MomentError, the same on every rank, when the machines' flags disagree."""
    first = facts[0]
    if any(f.node_rank == UNKNOWN for f in facts):
        raise MomentError("not every machine says its node rank")
    for f in facts:
        if f.nnodes != first.nnodes:
            raise MomentError(f"the machines give different --nnodes: {first.nnodes} on {_machine(first)}, "
                              f"{f.nnodes} on {_machine(f)}", hint="give every machine the same --nnodes")
    for f in facts:
        if f.local_world_size != first.local_world_size:
            raise MomentError(f"the machines run different numbers of ranks: --nproc {first.local_world_size} on "
                              f"{_machine(first)}, {f.local_world_size} on {_machine(f)}",
                              hint="give every machine the same --nproc")
    for f in facts:
        if f.backend != first.backend:
            raise MomentError(f"{_machine(first)} trains with {first.backend}, {_machine(f)} with {f.backend}: CPU "
                              "and GPU machines cannot train together", hint="give every machine the same --device")
    seen: dict[tuple[int, int], RankFacts] = {}
    for f in facts:
        if (f.node_rank, f.local_rank) in seen:
            other = seen[(f.node_rank, f.local_rank)]
            raise MomentError(f"two machines gave --node-rank {f.node_rank} ({other.host} and {f.host}, or one machine "
                              "started twice)", hint=f"give each machine its own --node-rank, 0 to {first.nnodes - 1}")
        seen[(f.node_rank, f.local_rank)] = f
    nodes = sorted({f.node_rank for f in facts})
    if nodes != list(range(first.nnodes)) or len(facts) != first.nnodes * first.local_world_size:
        raise MomentError(f"the machines that joined gave node ranks {nodes}, not 0 to {first.nnodes - 1}",
                          hint=f"give each machine its own --node-rank, 0 to {first.nnodes - 1}")
    return [f.node_rank * f.local_world_size + f.local_rank for f in facts]


#: settings every machine's ranks must share: they decide the batches, the model and when the ranks meet
#: (a checkpoint is a collective); the rest (the layout, caches, budget, I/O) is each machine's own
SHARED_SETTINGS = ("model", "epochs", "fanouts", "layers", "batch_size", "hidden", "lr", "seed", "features",
                   "checkpoints", "checkpoint_every", "resume", "peer_tier", "task", "negatives", "loss", "optimizer",
                   "weight_decay", "predict", "predict_nodes", "embed")


@dataclass(frozen=True)
class RunFacts:
    """What a rank's machine trains on, gathered from every rank once the process group exists."""

    node_rank: int
    host: str
    dataset_id: str
    dataset: str
    layout: str | None
    split_id: str | None  # a split layout's id (None: every row is in this machine's layout)
    split_machine: int | None
    split_machines: tuple[str, ...] = ()
    settings: tuple[tuple[str, str], ...] = ()  # SHARED_SETTINGS as resolved on this rank


def check_agents(facts: list[RunFacts]) -> None:
    """Refuse machines that do not train the same thing (facts of every rank, in rank order): another dataset,
    layouts of different splits (or a split and a whole layout), a split's machine on the wrong node rank
    or on two, other settings. One MomentError, the same on every rank."""
    first = facts[0]

    for f in facts:
        if f.dataset_id != first.dataset_id:
            raise MomentError(f"the machines train different datasets: {first.dataset} (id {first.dataset_id[:12]}) on "
                              f"{_machine(first)}, {f.dataset} (id {f.dataset_id[:12]}) on {_machine(f)}",
                              hint="every machine's layout must be placed from the same dataset")
    for f in facts:
        if f.split_id != first.split_id:
            def what(x: RunFacts) -> str:
                return f"layout {x.layout} of split {x.split_id[:12]}" if x.split_id else f"layout {x.layout} (every row)"
            raise MomentError(f"the machines' layouts are not of one split: {what(first)} on {_machine(first)}, "
                              f"{what(f)} on {_machine(f)}", hint="give every machine its own layout of the same `moment place "
                                                "--machines` output, or every machine a whole layout")
    if first.split_id is not None:
        n = len(first.split_machines)
        nodes = sorted({f.node_rank for f in facts})
        if len(nodes) != n:
            raise MomentError(f"the layouts are split over {n} machines ({', '.join(first.split_machines)}), but "
                              f"{len(nodes)} machines train", hint=f"start {n} machines, --nnodes {n}")
        for f in facts:
            if f.split_machine != f.node_rank:
                raise MomentError(f"{_machine(f)} has machine {f.split_machines[f.split_machine]}'s layout "
                                  f"({f.layout}), which is node rank {f.split_machine}",
                                  hint="give each machine its own part of the split, machine K the split's machine K "
                                       "(`moment layout info` says which; under `moment train`, with --node-rank K)")
    for f in facts:
        if f.settings != first.settings:
            diff = [f"{k} {a} vs {b}" for (k, a), (_, b) in zip(first.settings, f.settings, strict=True) if a != b]
            raise MomentError(f"the machines train with different settings ({_machine(first)} vs {_machine(f)}): "
                              + "; ".join(diff), hint="give every machine the same training options")
