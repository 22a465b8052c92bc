"""Fitting one step part's law to measured times, with every step kept.

The law is a conditional-mean law: non-negative coefficients whose prediction is the expected time of
a step of that shape, slow steps included (weighted least squares on relative error, weights 1/law,
iterated: step times span orders of magnitude and their scatter grows with them). On a shared machine
short steps are slowed proportionally more than long ones (a stolen time slice is a larger share of a
short step than of a long one); a median law times one global slowdown factor would then be biased per
shape, while the mean law absorbs the average stolen time in its per-step and per-sequence terms. The
scatter around it lives on in the residual ratios (sim.cost_models.residuals), none dropped.
"""
from __future__ import annotations

import numpy as np

from sim.cost_models.calibrated import error_stats, nnls
from sim.cost_models.profile import FitStats


def fit_mean_law(x: np.ndarray, y: np.ndarray, iterations: int = 10) -> np.ndarray:
    """Coefficients c >= 0 minimising sum ((y - x c) / (x c))^2 over the rows with y > 0 (by iterating
    the weights from the previous solution); zeros when no row is positive (a part the trace did not
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
        w = 1.0 / np.maximum(a @ c, floor)
        if done:
            break
    coef[used] = c / scale[used]
    return coef


def ratios(y: np.ndarray, pred: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
    """measured / law per step; 1 where the law or the measurement is missing (nothing to scale)."""
    ok = (pred > 0) & (y > 0) & (True if measured is None else measured)
    return np.where(ok, y / np.where(ok, pred, 1.0), 1.0)


def part_stats(y: np.ndarray, pred: np.ndarray) -> FitStats:
    """error_stats over the steps where the part was measured (y > 0); NaNs when there are none."""
    rows = y > 0
    return error_stats(y[rows], pred[rows]) if rows.any() else FitStats()
