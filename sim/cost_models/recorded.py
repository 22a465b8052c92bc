"""`recorded`: step times read back from an engine trace, for replaying that very run.

Step i takes what step i took in the trace once the step before it had ended (`end - max(start,
previous end)`: under async scheduling step i is scheduled while step i-1 still runs, and the loop
starts its device time when i-1 ends), and `step_start(i)` tells the loop when the engine began it, so
a replay on the same config reproduces the engine's clock, every step's end included, and hence every
scheduling decision. Steps past the end of the trace (a replay with another config can take more)
take the median recorded step time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults, StepTiming


class RecordedCostModel(CostModelDefaults):
    name = "recorded"

    def __init__(self, starts: np.ndarray, ends: np.ndarray, source: str = "") -> None:
        self.starts = [float(s) for s in starts]
        previous_ends = [-np.inf, *ends[:-1]]
        self.durations = [max(0.0, float(e - max(s, p))) for s, e, p in zip(starts, ends, previous_ends)]
        self.fallback = float(np.median(self.durations)) if self.durations else 0.0
        self.source = source

    @classmethod
    def from_trace(cls, trace: Any) -> RecordedCostModel:
        steps = trace.steps.sort_values("step", kind="stable")
        return cls(steps["start"].to_numpy(dtype=float), steps["end"].to_numpy(dtype=float), str(trace.path))

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(self.durations[step] if step < len(self.durations) else self.fallback)

    def step_start(self, step: int) -> float | None:
        """When the engine started this step (trace seconds); None past the recorded steps."""
        return self.starts[step] if step < len(self.starts) else None

    def describe(self) -> dict:
        return {"source_trace": self.source, "num_steps": len(self.durations),
                "median_step_time_s": self.fallback, "total_step_time_s": float(sum(self.durations))}
