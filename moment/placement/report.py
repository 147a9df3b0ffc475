"""How well a placement realises the planner's shares (what `moment place --json` prints).

Achieved share of a bin = hotness of its nodes / total hotness. Cross-socket share: every GPU samples
the same distribution, so GPU g reads bin b with probability achieved(b); the read crosses the
socket link (UPI/QPI) when b's socket differs from g's. Bins or GPUs without a socket are not counted.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field

from moment.placement.assignment import Assignment


class BinReport(BaseModel):
    name: str
    kind: str
    socket: str | None = None
    rows: int
    capacity_rows: int
    bytes: int = Field(description="rows x row stride on the medium")
    target_share: float
    achieved_share: float
    rel_error: float | None = Field(None, description="|achieved - target| / target; None when target is 0")


class PolicyReport(BaseModel):
    policy: str
    engine: str | None = None
    pool: int | None = None
    seconds: float | None = None
    bins: list[BinReport]
    max_rel_error: float = Field(description="over bins with a positive target")
    mean_rel_error: float
    l1_error: float = Field(description="sum over bins of |achieved - target| (0..2)")
    cross_socket_share: float = Field(description="share of all GPU reads that cross a socket link")


class PlacementReport(BaseModel):
    num_nodes: int
    row_stride: int
    total_hotness: float
    policies: dict[str, PolicyReport]


def policy_report(
    a: Assignment, *, row_stride: int, gpu_sockets: list[str | None] | None = None, seconds: float | None = None,
    cache_row_bytes: int | None = None,
) -> PolicyReport:
    """Per-bin target vs achieved shares of one assignment. `gpu_sockets` defaults to the GPU bins'.
    `cache_row_bytes`: bytes a row takes in a GPU/CPU cache (unpadded); default `row_stride`."""
    bins = a.bins
    target = np.array(bins.target_shares())
    achieved = a.achieved_shares()
    out, errs = [], []
    cache_row = cache_row_bytes or row_stride
    for i, b in enumerate(bins):
        rel = abs(achieved[i] - target[i]) / target[i] if target[i] > 0 else None
        if rel is not None:
            errs.append(rel)
        out.append(BinReport(
            name=b.name, kind=b.kind, socket=b.socket, rows=int(a.rows[i]), capacity_rows=b.capacity_rows,
            bytes=int(a.rows[i]) * (cache_row if b.is_cache else row_stride), target_share=float(target[i]),
            achieved_share=float(achieved[i]), rel_error=None if rel is None else float(rel),
        ))
    if gpu_sockets is None:
        gpu_sockets = [bins[i].socket for i in bins.of_kind("gpu")]
    return PolicyReport(
        policy=a.policy, engine=a.engine, pool=a.pool, seconds=seconds, bins=out,
        max_rel_error=float(max(errs, default=0.0)), mean_rel_error=float(np.mean(errs)) if errs else 0.0,
        l1_error=float(np.abs(achieved - target).sum()),
        cross_socket_share=cross_socket_share(a, gpu_sockets),
    )


def cross_socket_share(a: Assignment, gpu_sockets: list[str | None]) -> float:
    gs = [s for s in gpu_sockets if s is not None]
    if not gs:
        return 0.0
    achieved = a.achieved_shares()
    total = 0.0
    for g in gs:
        total += sum(float(achieved[i]) for i, b in enumerate(a.bins) if b.socket is not None and b.socket != g)
    return total / len(gs)


def placement_report(
    assignments: dict[str, Assignment], *, row_stride: int, gpu_sockets: list[str | None] | None = None,
    seconds: dict[str, float] | None = None, cache_row_bytes: int | None = None,
) -> PlacementReport:
    """Compare policies on the same hotness and bins: `policies: {ddak: ..., hash: ..., degree: ...}`."""
    first = next(iter(assignments.values()))
    return PlacementReport(
        num_nodes=first.num_nodes, row_stride=row_stride, total_hotness=first.total_access,
        policies={k: policy_report(a, row_stride=row_stride, gpu_sockets=gpu_sockets,
                                   seconds=(seconds or {}).get(k), cache_row_bytes=cache_row_bytes)
                  for k, a in assignments.items()},
    )


_HOW = {
    "degree": "deals single nodes round-robin by hotness rank over each tier's bins (caches filled to "
              "capacity), which hits equal targets closely but cannot follow unequal ones",
    "hash": "deals the hottest nodes round-robin over the caches and the rest over the SSDs by node id, "
            "which averages out to equal shares on many nodes but cannot follow unequal targets",
}


def ddak_note(reports: dict[str, PolicyReport], pool: int, pool_share: float, suggested_pool: int) -> str | None:
    """Why a baseline matches the planner's shares more closely than DDAK, when it does, with numbers.

    DDAK moves whole pools, so a bin's share is off by up to one pool's accesses (`pool_share` = the
    hottest pool's share of all reads); the baselines move single nodes."""
    d = reports.get("ddak")
    if d is None:
        return None
    better = sorted((r for k, r in reports.items() if k != "ddak" and r.mean_rel_error < d.mean_rel_error),
                    key=lambda r: (r.mean_rel_error, r.policy))
    if not better:
        return None
    b = better[0]
    targets = [x.target_share for x in d.bins if x.target_share > 0]
    smallest = min(targets) if targets else 0.0
    text = (f"{b.policy} matches the planner's shares more closely than DDAK here (mean error "
            f"{b.mean_rel_error:.2%} vs {d.mean_rel_error:.2%}): DDAK moves nodes in pools of {pool}, and the "
            f"hottest pool carries {pool_share:.2%} of all reads")
    if smallest > 0:
        text += f", {pool_share / smallest:.0%} of the smallest bin target ({smallest:.2%})"
    text += f", so its shares are quantised that coarsely; {b.policy} {_HOW.get(b.policy, 'moves single nodes')}"
    if suggested_pool < pool:
        text += f". A smaller pool fixes it: --pool {suggested_pool} (the default picks it)"
    return text + "."
