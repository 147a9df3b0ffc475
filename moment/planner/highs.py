"""One HiGHS call for the planner's LPs: what `scipy.optimize.linprog(method="highs")` does, through
`highspy` directly.

`scipy.optimize` takes about half a second to import (and `scipy.sparse` another tenth), longer than
`moment plan` spends solving; `highspy` loads in a few hundredths. The call is made as scipy makes it,
so the answers are the same: the constraint matrix in compressed columns (duplicates summed, rows
sorted within a column), presolve on, the dual simplex, and the same check of the returned point
against the constraints (scipy's `_check_result`: within sqrt(1e-9) * 10) before it counts as optimal.

Constraint matrices come as COO triples (rows, columns, values) and a row count, which is how the
planner builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

#: scipy's acceptance tolerance on a returned point (its `tol` 1e-9, as `_check_result` widens it)
CHECK_TOL = float(np.sqrt(1e-9) * 10)
#: HiGHS drops constraint coefficients smaller than this (its `small_matrix_value`, set to its default here so
#: that the planner can say when a figure was dropped: a link this small a share of the demand reads as none)
SMALL_MATRIX_VALUE = 1e-9

Coo = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass
class Result:
    ok: bool  # optimal, and the point satisfies the constraints
    x: np.ndarray | None
    message: str


def _csc(blocks: list[tuple[Coo, int]], n_col: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stack the COO blocks (each with its row count) into one compressed-column matrix: entries sorted
    by column then row, duplicates summed one after the other in the order given (explicit zeros kept,
    as scipy keeps them). scipy adds duplicates in an order its sort leaves unspecified: the same sum
    where they are equal, which is where the planner's LPs have them (a GPU's share of a route, the
    same for every GPU)."""
    rows, cols, vals, off = [], [], [], 0
    for (r, c, v), n in blocks:
        rows.append(np.asarray(r, dtype=np.int64) + off)
        cols.append(np.asarray(c, dtype=np.int64))
        vals.append(np.asarray(v, dtype=float))
        off += n
    r, c, v = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
    order = np.lexsort((r, c))
    r, c, v = r[order], c[order], v[order]
    if len(r):
        new = np.ones(len(r), dtype=bool)
        new[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
        starts = np.flatnonzero(new)
        sizes = np.diff(np.append(starts, len(r)))
        total = v[starts]
        for k in range(1, int(sizes.max())):  # one addend at a time, as scipy adds duplicates (not pairwise)
            more = sizes > k
            total[more] += v[starts[more] + k]
        r, c, v = r[starts], c[starts], total
    start = np.zeros(n_col + 1, dtype=np.int64)
    np.cumsum(np.bincount(c, minlength=n_col), out=start[1:])
    return start, r, v


def linprog(c: np.ndarray, *, A_ub: Coo, b_ub: np.ndarray, A_eq: Coo, b_eq: np.ndarray,
            bounds: np.ndarray, presolve: bool = True) -> Result:
    """min c x subject to A_ub x <= b_ub, A_eq x = b_eq, bounds[:, 0] <= x <= bounds[:, 1]. `presolve`: HiGHS'
    presolve, which on the planner's small LPs costs more than it saves, but picks the optimal vertex that
    the predictions report (their bottlenecks) where the optimum is not unique."""
    c = np.asarray(c, dtype=float)
    b_ub, b_eq = np.asarray(b_ub, dtype=float), np.asarray(b_eq, dtype=float)
    bounds = np.asarray(bounds, dtype=float)
    n_col, n_ub, n_eq = len(c), len(b_ub), len(b_eq)
    start, index, value = _csc([(A_ub, n_ub), (A_eq, n_eq)], n_col)
    lhs = np.concatenate([np.full(n_ub, -np.inf), b_eq])
    rhs = np.concatenate([b_ub, b_eq])

    def finite(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        inf = np.isinf(a)
        a[inf] = np.sign(a[inf]) * highspy.kHighsInf
        return a

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_col, n_ub + n_eq
    lp.col_cost_ = c
    lp.col_lower_, lp.col_upper_ = finite(bounds[:, 0]), finite(bounds[:, 1])
    lp.row_lower_, lp.row_upper_ = finite(lhs), finite(rhs)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_col, n_ub + n_eq
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = start, index, value
    h = highspy._Highs()  # the bare solver: `highspy.Highs` prints a banner on stdout
    for key, val in (("output_flag", False), ("log_to_console", False), ("presolve", "on" if presolve else "off"),
                     ("simplex_strategy", 1), ("small_matrix_value", SMALL_MATRIX_VALUE)):  # 1: dual simplex
        h.setOptionValue(key, val)
    if h.passModel(lp) == highspy.HighsStatus.kError:
        return Result(False, None, "HiGHS refused the model")
    h.run()
    status = h.getModelStatus()
    message = f"{h.modelStatusToString(status)} (HiGHS status {int(status)})"
    if status != highspy.HighsModelStatus.kOptimal:
        return Result(False, None, message)
    sol = h.getSolution()
    x = np.array(sol.col_value)
    row = np.array(sol.row_value)
    tol = CHECK_TOL
    feasible = not (np.isnan(x).any() or np.isnan(row).any()) and bool(
        np.all((x >= bounds[:, 0] - tol) & (x <= bounds[:, 1] + tol))
        and not (b_ub - row[:n_ub] < -tol).any() and not (np.abs(b_eq - row[n_ub:]) > tol).any())
    if not feasible:
        return Result(False, x, "the solution does not satisfy the constraints within "
                      f"{tol:.2E} (HiGHS status {int(status)})")
    return Result(True, x, message)
