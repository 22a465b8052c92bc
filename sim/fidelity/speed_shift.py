"""How much faster or slower the machine ran in one run than in another, measured on steps both ran alike.

A profile calibrated on one run carries the machine's speed during that run. On a shared machine that
speed drifts between runs taken minutes apart, so a prediction's step-time error mixes the cost model's
own error with the machine's change. Two decode-only steps with the same number of sequences and about
the same context per sequence do the same work, so the ratio of their device times is the machine's
change alone: no cost model enters it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.calibration.calibrate import step_table
from traces import Trace

# Steps whose mean context per sequence falls in the same bin of this many tokens count as one shape:
# narrow enough that attention's share of a step barely moves within a bin, wide enough to fill it.
CONTEXT_BIN = 64
MIN_STEPS = 5  # per shape and run: a median of fewer steps is one noisy step away from another value


@dataclass(slots=True, frozen=True)
class SpeedShift:
    """`ratio`: B's device seconds over A's for the same step shape (below 1: B's machine ran faster);
    `shapes`: how many shapes both runs ran at least MIN_STEPS times; `steps`: the fewer steps of the
    two runs, summed over those shapes."""

    ratio: float
    shapes: int
    steps: int


def decode_shapes(trace: Trace) -> pd.DataFrame:
    """Per decode-only step shape (sequences, context bin): the median device seconds and the step count."""
    table = step_table(trace)
    if not len(table):
        return pd.DataFrame(columns=["median", "count"])
    dec = table[(table["pt"] == 0) & (table["ds"] > 0) & (table["device"] > 0)]
    shape = pd.DataFrame({"seqs": dec["ds"], "ctx_bin": dec["ctx"] // dec["ds"] // CONTEXT_BIN,
                          "device": dec["device"]})
    return shape.groupby(["seqs", "ctx_bin"])["device"].agg(["median", "count"])


def same_shape_speed(a: Trace, b: Trace, min_steps: int = MIN_STEPS) -> SpeedShift | None:
    """B's machine speed against A's: the geometric mean over shared shapes of the ratio of median device
    times, each shape weighted by the fewer of its two step counts. None when no shape is shared."""
    shapes_a, shapes_b = decode_shapes(a), decode_shapes(b)
    if not (len(shapes_a) and len(shapes_b)):  # a trace kept without its decisions (--trace-level steps)
        return None
    both = pd.merge(shapes_a, shapes_b, left_index=True, right_index=True, suffixes=("_a", "_b"))
    both = both[(both["count_a"] >= min_steps) & (both["count_b"] >= min_steps)]
    if not len(both):
        return None
    weight = np.minimum(both["count_a"], both["count_b"]).to_numpy(dtype=float)
    log_ratio = np.log(both["median_b"].to_numpy(dtype=float) / both["median_a"].to_numpy(dtype=float))
    return SpeedShift(float(np.exp(np.dot(weight, log_ratio) / weight.sum())), len(both), int(weight.sum()))
