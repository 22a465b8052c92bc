"""Fitting one step part's law to measured times, with every step kept.

The law is a median law: non-negative coefficients minimising the sum of |relative error| over all
steps (iteratively reweighted least squares on top of the NNLS solver). A median fit is what a few wild
steps cannot drag, so nothing has to be thrown away to get the batch-shape dependence right; the wild
steps then live on in the residual ratios (sim.cost_models.residuals) instead of being dropped.
"""
from __future__ import annotations

import numpy as np

from sim.cost_models.calibrated import error_stats, nnls


def fit_median_law(x: np.ndarray, y: np.ndarray, iterations: int = 40) -> np.ndarray:
    """Coefficients c >= 0 minimising sum |y - x c| / y over the rows with y > 0 (zeros elsewhere when
    no row is positive: a part the trace did not measure costs nothing)."""
    rows = y > 0
    coef = np.zeros(x.shape[1])
    scale = np.linalg.norm(x[rows], axis=0) if rows.any() else np.zeros(x.shape[1])
    used = scale > 0
    if not rows.any() or not used.any():
        return coef
    a = x[rows][:, used] / scale[used] / y[rows, None]
    ones = np.ones(int(rows.sum()))
    w = np.ones_like(ones)
    c = np.zeros(int(used.sum()))
    for _ in range(iterations):
        sw = np.sqrt(w)
        new = nnls(a * sw[:, None], ones * sw)
        r = np.abs(1.0 - a @ new)
        w = 1.0 / np.maximum(r, 1e-4)
        done = np.allclose(new, c, rtol=1e-7, atol=0)
        c = new
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
