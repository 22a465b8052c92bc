"""`recorded`: step times read back from an engine trace, for replaying that very run.

Step i takes what step i took in the trace once the step before it had ended (`end - max(start,
previous end)`: under async scheduling step i is scheduled while step i-1 still runs, and the loop
starts its device time when i-1 ends), and `step_start(i)` tells the loop when the engine began it, so
a replay on the same config reproduces the engine's clock, every step's end included, and hence every
scheduling decision. A step's recorded `execute_time` stays its device part and the rest its host part,
so the replay's trace splits each step as the engine's did. Steps past the end of the trace (a replay
with another config can take more) take the median recorded step time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults, StepTiming

if TYPE_CHECKING:
    from traces import Trace


class RecordedCostModel(CostModelDefaults):
    name = "recorded"

    def __init__(self, starts: np.ndarray, ends: np.ndarray, source: str = "",
                 execute: np.ndarray | None = None) -> None:
        self.starts = [float(s) for s in starts]
        previous_ends = [-np.inf, *ends[:-1]]
        self.durations = [max(0.0, float(e - max(s, p))) for s, e, p in zip(starts, ends, previous_ends)]
        self.timings = [_split(d, None if execute is None else float(x))
                        for d, x in zip(self.durations, execute if execute is not None else self.durations)]
        self.fallback = float(np.median(self.durations)) if self.durations else 0.0
        self.source = source

    @classmethod
    def from_trace(cls, trace: Trace) -> RecordedCostModel:
        steps = trace.steps.sort_values("step", kind="stable")
        execute = steps["execute_time"].to_numpy(dtype=float) if "execute_time" in steps else None
        return cls(steps["start"].to_numpy(dtype=float), steps["end"].to_numpy(dtype=float), str(trace.path),
                   execute)

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return self.timings[step] if step < len(self.timings) else StepTiming(self.fallback)

    def step_start(self, step: int) -> float | None:
        """When the engine started this step (trace seconds); None past the recorded steps."""
        return self.starts[step] if step < len(self.starts) else None

    def describe(self) -> dict:
        return {"source_trace": self.source, "num_steps": len(self.durations),
                "median_step_time_s": self.fallback, "total_step_time_s": float(sum(self.durations))}


def _split(duration: float, execute: float | None) -> StepTiming:
    """The step's recorded execute time as its device part, the rest as host, where they add up to the
    duration to the bit (the replay's clock must be the recording's); else all of it as device."""
    if execute is None or not 0.0 < execute < duration:
        return StepTiming(duration)
    timing = StepTiming(execute, duration - execute)
    return timing if timing.total == duration else StepTiming(duration)
