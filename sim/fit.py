"""Fitting one step part's law to measured times, with every step kept.

The law is the shape of a typical step: non-negative coefficients fitted on relative error with an L1
loss (iteratively reweighted least squares, weights 1/(law * sqrt|relative error|)), since step times
span orders of magnitude and their scatter grows with them. L1, not squares, because on a shared machine
a slow spell lands at random on a handful of the rare steps (a calibration run has tens of prefill steps
against thousands of decode steps) and a squared loss lets those few set the rare terms: in one
fidelity-bench calibration the squared-loss law had 715 us per prefill token against 167-253 in the
others, and the held-out run's long prefills took a median 0.22 of it (0.50 with L1). The machine's
slowness is not lost: sim calibrate scales the law by total measured / total law for the expected step
(`mean_ratio`), and every step's measured / law ratio lives on in the residual table
(sim.cost_models.residuals) that sampled replays draw from, none dropped.
"""
from __future__ import annotations

import numpy as np

from sim.cost_models.calibrated import error_stats, nnls

L1_FLOOR = 0.05  # relative errors below 5 % weigh as 5 %: keeps the reweighting finite near a perfect fit


def fit_law(x: np.ndarray, y: np.ndarray, iterations: int = 30) -> np.ndarray:
    """Coefficients c >= 0 minimising sum |y - x c| / (x c) over the rows with y > 0 (by iterating the
    weights from the previous solution); zeros when no row is positive (a part the trace did not
    measure costs nothing)."""
    rows = y > 0
    coef = np.zeros(x.shape[1])
    scale = np.linalg.norm(x[rows], axis=0) if rows.any() else np.zeros(x.shape[1])
    used = scale > 0
    if not rows.any() or not used.any():
        return coef
    a, yy = x[rows][:, used] / scale[used], y[rows]
    floor = 1e-3 * float(np.median(yy))
    w = 1.0 / yy
    c = np.zeros(int(used.sum()))
    for _ in range(iterations):
        new = nnls(a * w[:, None], yy * w)
        done = np.allclose(new, c, rtol=1e-7, atol=0)
        c = new
        pred = np.maximum(a @ c, floor)
        w = 1.0 / (pred * np.sqrt(np.maximum(np.abs(yy / pred - 1.0), L1_FLOOR)))
        if done:
            break
    coef[used] = c / scale[used]
    return coef


def ratios(y: np.ndarray, pred: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
    """measured / law per step; 1 where the law or the measurement is missing (nothing to scale)."""
    ok = (pred > 0) & (y > 0) & (True if measured is None else measured)
    return np.where(ok, y / np.where(ok, pred, 1.0), 1.0)


def part_stats(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """error_stats over the steps where the part was measured (y > 0); NaNs when there are none."""
    rows = y > 0
    if not rows.any():
        return {"num_steps": 0, "mape": float("nan"), "r2": float("nan"), "p50_abs_pct": float("nan"),
                "p90_abs_pct": float("nan")}
    return error_stats(y[rows], pred[rows])
