"""Per-step replay of an epoch on the capacity graph (`moment simulate`).

The aggregate LP (lp.py) predicts one steady flow for the whole epoch. Training is a sequence of
synchronous DDP steps: in step t every rank g reads its batch's rows, B[t, g, s] bytes from storage
node s (which bin holds each row comes from the layout), and the step ends when the *last* GPU has
its rows (the step barrier). The replay solves the link sharing of each step on the same capacity
graph and sums the step times:

    T_t = least time in which every GPU receives B[t, g, :] (same links, same read limits)
    epoch = sum_t T_t

Where every (storage node, GPU) pair has one route (PCIe trees without NVLink), T_t has a closed
form, max(max_e load_e / c_e, max_s served_s / L_s), computed for all steps at once; where a pair
has several routes (NVLink, two socket links) each step is a small LP over the route splits.

Per GPU, `busy` is the time its own reads of a step need at the rates the other GPUs' reads leave
it (their loads spread over the step); the rest of the step it waits at the barrier (`idle`).

Why replay and LP differ, split exactly into two parts:
  shares: the LP's storage shares vs the shares the trace realises (the sum of all steps solved as
          one step, `aggregate_s`, vs the LP's time);
  steps:  step-to-step variation and the barrier (sum of step maxima vs the maximum of the sums).

No torch here; the trace is turned into B by the caller (`layout_demands`) or drawn synthetically.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, Field

from moment.errors import MomentError
from moment.planner.highs import linprog
from moment.planner.lp import _paths
from moment.planner.network import FlowNetwork

#: a link at or above this utilisation in a step limits that step
LIMIT_UTILISATION = 0.999
#: steps per HiGHS call when routes must be solved
LP_BATCH = 32
#: The replay holds every step at once: the demands (steps x GPUs x storage nodes) and a few arrays of
#: per-GPU link loads (steps x GPUs x links), float64. Past this many bytes it is refused up front
#: rather than dying in the middle of an allocation; an epoch of real training has far fewer steps.
MAX_REPLAY_BYTES = 1 << 30
#: Steps whose (storage, GPU) pairs have several routes are one small LP each: past this many the
#: replay would run for many minutes, so it is refused up front too.
MAX_ROUTED_STEPS = 20_000


class GpuReplay(BaseModel):
    gpu: str
    bytes: float = Field(description="bytes this GPU read in the epoch")
    busy_s: float = Field(description="time its own reads needed at the rates the other GPUs left it")
    idle_s: float = Field(description="time it waited at the step barrier for slower GPUs")
    mean_gbps: float = Field(description="bytes / epoch time, GB/s")


class LimitingLink(BaseModel):
    id: str = Field(description="directed link id ('sw1->sw0') or a storage read limit ('ssd3:read')")
    kind: str
    steps: int = Field(description="steps this link limited (utilisation >= 99.9% in the step)")
    share_of_steps: float
    seconds: float = Field(description="time of the steps it limited")


class ReplayReport(BaseModel):
    source: str = Field(description="'uniform' (expected counts), 'synthetic' (sampled counts) or 'layout'")
    steps: int
    epoch_s: float = Field(description="sum over steps of the slowest GPU's read time")
    lp_epoch_s: float = Field(description="the aggregate LP's epoch read time for the same placement")
    aggregate_s: float = Field(description="the whole trace solved as one step (the trace's own shares)")
    replay_vs_lp: float = Field(description="epoch_s / lp_epoch_s - 1")
    shares_effect: float = Field(description="aggregate_s / lp_epoch_s - 1: realised vs planned shares")
    steps_effect: float = Field(description="epoch_s / aggregate_s - 1: per-step variation and the barrier")
    per_gpu: list[GpuReplay]
    limiting_links: list[LimitingLink]
    realised_shares: dict[str, float] = Field(description="share of all bytes served by each storage node")
    why: str = Field(description="one sentence on where the difference to the LP comes from")


class Replayer:
    """Routes of one capacity graph, prepared once; `run(B)` replays any number of steps."""

    def __init__(self, net: FlowNetwork):
        self.net = net
        self.G, self.S, self.E = len(net.gpus), len(net.storage), len(net.edges)
        paths = _paths(net, None)
        self.cap = np.array([e.capacity for e in net.edges], dtype=float)
        self.finite = np.isfinite(self.cap)
        self.limit = np.array([s.limit for s in net.storage], dtype=float)
        # single-route pairs: A[e, g*S + s] = 1 where the pair's route uses edge e
        self.A = np.zeros((self.E, self.G * self.S))
        self.multi: list[tuple[int, int, list[list[int]]]] = []
        self.reachable = np.zeros((self.G, self.S), dtype=bool)
        for g, found in enumerate(paths):
            for s, routes in found.items():
                self.reachable[g, s] = True
                if len(routes) == 1:
                    self.A[routes[0], g * self.S + s] = 1.0
                else:
                    self.multi.append((g, s, routes))

    # ---- per-step solve ----------------------------------------------------------------------------
    def _loads(self, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fixed per-GPU edge loads (steps, G, E) of the single-route pairs, and served (steps, S)."""
        n = B.shape[0]
        per_pair = np.zeros((n, self.G, self.G * self.S))
        for g in range(self.G):
            per_pair[:, g, g * self.S:(g + 1) * self.S] = B[:, g, :]
        load_g = per_pair @ self.A.T
        return load_g, B.sum(axis=1)

    def _route_steps(self, B: np.ndarray, load_g: np.ndarray, t_floor: np.ndarray) -> np.ndarray:
        """Solve the multi-route splits of each step by LP; adds their loads into load_g; returns T."""
        n = B.shape[0]
        T = np.empty(n)
        routes = [(g, s, r) for g, s, rs in self.multi for r in rs]
        fin_idx = np.nonzero(self.finite)[0]
        row_of = -np.ones(self.E, dtype=np.int64)
        row_of[fin_idx] = np.arange(len(fin_idx))
        R, F = len(routes), len(fin_idx)
        # one block: columns [T, x_0..x_{R-1}] (bytes as a share of the step's total, for scaling)
        ub_r, ub_c, ub_v = [], [], []
        for j, (_, _, r) in enumerate(routes):
            for e in r:
                if self.finite[e]:
                    ub_r.append(row_of[e])
                    ub_c.append(1 + j)
                    ub_v.append(1.0)
        ub_r += list(range(F))
        ub_c += [0] * F
        eq_r, eq_c = [], []
        pair_rows = {(g, s): i for i, (g, s, _) in enumerate(self.multi)}
        for j, (g, s, _) in enumerate(routes):
            eq_r.append(pair_rows[(g, s)])
            eq_c.append(1 + j)
        lengths = np.array([len(r) for _, _, r in routes], dtype=float)
        for a in range(0, n, LP_BATCH):
            idx = range(a, min(n, a + LP_BATCH))
            k = len(idx)
            nv, P = 1 + R, len(self.multi)
            rows, cols, vals, b_ub, erow, ecol, b_eq, bounds, obj = [], [], [], [], [], [], [], [], []
            for i, t in enumerate(idx):
                scale = max(B[t].sum(), 1.0)
                fixed = load_g[t].sum(axis=0)[fin_idx] / scale
                rows.append(np.array(ub_r) + i * F)
                cols.append(np.array(ub_c) + i * nv)
                vals.append(np.array(ub_v + list(-self.cap[fin_idx] / scale)))
                b_ub.append(-fixed)
                erow.append(np.array(eq_r) + i * P)
                ecol.append(np.array(eq_c) + i * nv)
                b_eq.append(np.array([B[t, g, s] / scale for g, s, _ in self.multi]))
                bounds.append(np.vstack([[t_floor[t], np.inf], np.tile([0.0, np.inf], (R, 1))]))
                obj.append(np.concatenate([[1.0], 1e-9 * lengths]))
            A_ub = (np.concatenate(rows), np.concatenate(cols), np.concatenate(vals))
            A_eq = (np.concatenate(erow), np.concatenate(ecol), np.ones(k * R))
            res = linprog(np.concatenate(obj), A_ub=A_ub, b_ub=np.concatenate(b_ub), A_eq=A_eq,
                          b_eq=np.concatenate(b_eq), bounds=np.vstack(bounds))
            if not res.ok:
                raise MomentError(f"the replay's step LP has no solution ({res.message.strip()})")
            for i, t in enumerate(idx):
                x = res.x[i * nv:(i + 1) * nv]
                scale = max(B[t].sum(), 1.0)
                T[t] = x[0]
                for j, (g, _, r) in enumerate(routes):
                    load_g[t, g, r] += x[1 + j] * scale
        return T

    def step_times(self, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T per step, per-GPU edge loads (steps, G, E), served per storage node (steps, S))."""
        B = np.asarray(B, dtype=float)
        if B.ndim != 3 or B.shape[1:] != (self.G, self.S):
            raise ValueError(f"B must be (steps, {self.G}, {self.S}), got {B.shape}")
        bad = (B.sum(axis=0) > 0) & ~self.reachable
        if bad.any():
            g, s = (int(x[0]) for x in np.nonzero(bad))
            raise MomentError(f"{self.net.gpus[g]} reads from {self.net.storage[s].id}, which it cannot reach")
        load_g, served = self._loads(B)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_store = np.where(np.isfinite(self.limit), served / self.limit, 0.0).max(axis=1)
        if self.multi:
            T = self._route_steps(B, load_g, t_store)
        else:
            load = load_g.sum(axis=1)
            t_link = (load[:, self.finite] / self.cap[self.finite]).max(axis=1) if self.finite.any() else 0.0
            T = np.maximum(t_link, t_store)
        return T, load_g, served

    # ---- epoch ---------------------------------------------------------------------------------------
    def run(self, B: np.ndarray, lp_epoch_s: float, source: str) -> ReplayReport:
        B = np.asarray(B, dtype=float)
        T, load_g, served = self.step_times(B)
        epoch = float(T.sum())
        agg = float(self.step_times(B.sum(axis=0, keepdims=True))[0][0])
        busy = self._busy(T, load_g, B, served)
        per_gpu = []
        for g, gid in enumerate(self.net.gpus):
            nbytes = float(B[:, g, :].sum())
            per_gpu.append(GpuReplay(gpu=gid, bytes=nbytes, busy_s=float(busy[:, g].sum()),
                                     idle_s=float((T - busy[:, g]).sum()),
                                     mean_gbps=nbytes / epoch / 1e9 if epoch > 0 else 0.0))
        total = float(B.sum())
        shares = {s.id: float(served[:, i].sum()) / total if total else 0.0 for i, s in enumerate(self.net.storage)}
        report = ReplayReport(
            source=source, steps=int(B.shape[0]), epoch_s=epoch, lp_epoch_s=lp_epoch_s, aggregate_s=agg,
            replay_vs_lp=_rel(epoch, lp_epoch_s), shares_effect=_rel(agg, lp_epoch_s), steps_effect=_rel(epoch, agg),
            per_gpu=per_gpu, limiting_links=self._limiting(T, load_g, served), realised_shares=shares, why="")
        report.why = explain(report)
        return report

    def _busy(self, T: np.ndarray, load_g: np.ndarray, B: np.ndarray, served: np.ndarray) -> np.ndarray:
        """(steps, G): each GPU's time at the capacity left by the others' loads spread over the step."""
        Tc = np.where(T > 0, T, 1.0)[:, None, None]
        load = load_g.sum(axis=1, keepdims=True)
        cap = self.cap[self.finite][None, None, :]
        mine = load_g[:, :, self.finite]
        left = cap - (load[:, :, self.finite] - mine) / Tc
        with np.errstate(divide="ignore", invalid="ignore"):
            t_link = np.where(mine > 0, mine / np.maximum(left, 1e-300), 0.0).max(axis=2, initial=0.0)
            lim = np.where(np.isfinite(self.limit), self.limit, np.inf)[None, None, :]
            own = B  # (steps, G, S)
            left_s = lim - (served[:, None, :] - own) / Tc
            t_store = np.where(own > 0, own / np.maximum(left_s, 1e-300), 0.0).max(axis=2, initial=0.0)
        return np.minimum(np.maximum(t_link, t_store), T[:, None])

    def _limiting(self, T: np.ndarray, load_g: np.ndarray, served: np.ndarray) -> list[LimitingLink]:
        n = len(T)
        Tc = np.where(T > 0, T, np.inf)[:, None]
        load = load_g.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            u_e = np.where(self.finite[None, :], load / (self.cap[None, :] * Tc), 0.0)
            u_s = np.where(np.isfinite(self.limit)[None, :], served / (self.limit[None, :] * Tc), 0.0)
        rows = []
        for j, e in enumerate(self.net.edges):
            hit = u_e[:, j] >= LIMIT_UTILISATION
            if hit.any():
                rows.append((e.id, e.kind, hit))
        for j, s in enumerate(self.net.storage):
            hit = u_s[:, j] >= LIMIT_UTILISATION
            if hit.any():
                rows.append((f"{s.id}:read", s.tier, hit))
        out = [LimitingLink(id=i, kind=k, steps=int(h.sum()), share_of_steps=float(h.sum()) / n,
                            seconds=float(T[h].sum())) for i, k, h in rows]
        return sorted(out, key=lambda x: (-x.steps, x.id))


def _rel(a: float, b: float) -> float:
    return a / b - 1.0 if b > 0 else 0.0


def explain(r: ReplayReport) -> str:
    if abs(r.replay_vs_lp) < 1e-6:
        return "the replay matches the LP: every step reads the planned shares, so no GPU waits at a barrier"
    parts = []
    if abs(r.shares_effect) >= 1e-6:
        parts.append(f"the trace's storage shares differ from the planned ones ({r.shares_effect:+.1%})")
    if abs(r.steps_effect) >= 1e-6:
        worst = max(r.per_gpu, key=lambda g: g.idle_s)
        parts.append(f"per-step variation and the step barrier ({r.steps_effect:+.1%}; "
                     f"{worst.gpu} waits {worst.idle_s:.2f} s in all)")
    return f"replay is {r.replay_vs_lp:+.1%} vs the LP: " + "; ".join(parts)


def check_steps(net: FlowNetwork, steps: int, *, what: str = "the replay", hint: str | None = None) -> None:
    """Refuse a replay of `steps` steps that would not fit MAX_REPLAY_BYTES (or MAX_ROUTED_STEPS where
    steps are solved by LP), saying how much it would need and how many steps fit."""
    G, S, E = len(net.gpus), len(net.storage), len(net.edges)
    per_step = 8 * (G * S * (G + 2) + 4 * G * E + 2 * E)  # B, the per-pair loads, per-GPU link loads
    most = MAX_REPLAY_BYTES // per_step
    if steps > most:
        raise MomentError(
            f"{what}: replaying {steps:,} steps would hold about {steps * per_step / 2**30:,.1f} GiB of "
            f"per-step arrays ({G} GPUs x {S} storage nodes x {E} links per step); at most {most:,} steps fit in "
            f"the replay's {MAX_REPLAY_BYTES / 2**30:g} GiB", hint=hint)
    if steps > MAX_ROUTED_STEPS and any(len(r) > 1 for found in _paths(net, None) for r in found.values()):
        raise MomentError(
            f"{what}: {steps:,} steps, but on this machine (several routes between storage and GPUs) each step is "
            f"an LP, and at most {MAX_ROUTED_STEPS:,} are replayed", hint=hint)


# ---- where per-step demands come from ------------------------------------------------------------------
def steps_per_epoch(num_seeds: float, batch_size: int, gpus: int) -> int:
    """DDP steps in one epoch: each rank takes its 1/gpus of the seeds in batches."""
    return max(1, math.ceil(num_seeds / max(gpus, 1) / batch_size))


def synthetic_demands(net: FlowNetwork, shares: dict[str, float], steps: int, row_bytes: int, *,
                      seed: int = 0, uniform: bool = False) -> np.ndarray:
    """(steps, G, S) bytes: each GPU reads its epoch demand in `steps` equal batches; a batch's rows
    are spread over the storage nodes by `shares` (the data placement realises them): exactly
    (`uniform`) or drawn row by row (multinomial, seeded; rows = batch bytes / row_bytes)."""
    if steps <= 0 or row_bytes <= 0:
        raise MomentError("steps and row bytes must be positive")
    check_steps(net, steps)
    p = np.array([max(0.0, shares.get(s.id, 0.0)) for s in net.storage])
    if p.sum() <= 0:
        raise MomentError("the plan's storage shares are empty: nothing to replay")
    p = p / p.sum()
    G, S = len(net.gpus), len(net.storage)
    per_step = np.array([net.demand[g] / steps for g in net.gpus])
    if uniform:
        return np.broadcast_to(per_step[None, :, None] * p[None, None, :], (steps, G, S)).copy()
    rng = np.random.default_rng(seed)
    rows = np.maximum(1, np.round(per_step / row_bytes)).astype(np.int64)
    out = np.empty((steps, G, S))
    for g in range(G):
        out[:, g, :] = rng.multinomial(rows[g], p, size=steps) * (per_step[g] / rows[g])
    return out


def layout_demands(net: FlowNetwork, bin_of_node: np.ndarray, bin_names: list[str],
                   batches_per_rank: list[list[np.ndarray]], row_bytes: int) -> np.ndarray:
    """(steps, G, S) bytes from real traces: rank r is GPU r (net.gpus order); each batch's node ids
    are looked up in the layout's index (which bin holds the row); bins are the plan's storage nodes."""
    if len(batches_per_rank) != len(net.gpus):
        raise MomentError(f"{len(batches_per_rank)} rank traces for {len(net.gpus)} GPUs")
    col = {s.id: i for i, s in enumerate(net.storage)}
    missing = [b for b in bin_names if b not in col]
    if missing:
        raise MomentError(f"the layout's bins {missing} are not storage nodes of this placement",
                          hint="simulate the layout with the profile and placement it was placed for")
    to_col = np.array([col[b] for b in bin_names], dtype=np.int64)
    steps = max(len(b) for b in batches_per_rank)
    check_steps(net, steps, what="the layout's trace")
    out = np.zeros((steps, len(net.gpus), len(net.storage)))
    for g, batches in enumerate(batches_per_rank):
        for t, ids in enumerate(batches):
            out[t, g] = np.bincount(to_col[bin_of_node[ids]], minlength=len(net.storage)) * row_bytes
    return out
