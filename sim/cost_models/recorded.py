"""`recorded`: step times read back from an engine trace, for replaying that very run.

Step i takes what step i took in the trace once the step before it had ended (`end - max(start,
previous end)`: under async scheduling step i is scheduled while step i-1 still runs, and the loop
starts its device time when i-1 ends), and `step_start(i)` tells the loop when the engine began it, so
a replay on the same config reproduces the engine's clock, every step's end included, and hence every
scheduling decision. A step's recorded `execute_time` stays its device part and the rest its host part,
so the replay's trace splits each step as the engine's did.

A recorded time prices only the batch it was recorded for: a step whose batch is not the recorded one
(the schedule departed from the recording) or a step with work past the recorded steps is an error, never
a time looked up by index for another batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults, CostModelInfo, StepTiming

if TYPE_CHECKING:
    from traces import Trace


class ScheduleDeparted(ValueError):
    """A replay on recorded step times whose schedule is no longer the recording's."""


class RecordedCostModel(CostModelDefaults):
    name = "recorded"

    def __init__(self, starts: np.ndarray, ends: np.ndarray, source: str = "",
                 execute: np.ndarray | None = None, batches: list[tuple[int, int]] | None = None) -> None:
        """`batches`: each recorded step's (prefill tokens, decode tokens), what a time is checked against."""
        self.starts = [float(s) for s in starts]
        previous_ends = [-np.inf, *ends[:-1]]
        self.durations = [max(0.0, float(e - max(s, p))) for s, e, p in zip(starts, ends, previous_ends)]
        self.timings = [_split(d, None if execute is None else float(x))
                        for d, x in zip(self.durations, execute if execute is not None else self.durations)]
        self.fallback = float(np.median(self.durations)) if self.durations else 0.0
        self.source = source
        self.batches = batches

    @classmethod
    def from_trace(cls, trace: Trace) -> RecordedCostModel:
        steps = trace.steps.sort_values("step", kind="stable")
        execute = steps["execute_time"].to_numpy(dtype=float) if "execute_time" in steps else None
        batches = None
        if {"num_prefill_tokens", "num_decode_tokens"} <= set(steps.columns):
            batches = list(zip(steps["num_prefill_tokens"].astype(int).tolist(),
                               steps["num_decode_tokens"].astype(int).tolist()))
        return cls(steps["start"].to_numpy(dtype=float), steps["end"].to_numpy(dtype=float), str(trace.path),
                   execute, batches)

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        if step >= len(self.timings) and not (batch.num_prefill_tokens or batch.num_decode_tokens):
            return StepTiming(0.0)  # an empty step past the recording (an async batch queue draining): no work
        if step >= len(self.timings):
            raise ScheduleDeparted(f"--cost-model recorded: the replay runs past the trace's {len(self.timings)} "
                                   "recorded steps; its schedule is not the recording's, which recorded times do "
                                   "not price (use a cost model fitted to this trace: sim calibrate TRACE -o P.json, "
                                   "then --cost-model P.json)")
        if self.batches is not None and (batch.num_prefill_tokens, batch.num_decode_tokens) != self.batches[step]:
            prefill, decode = self.batches[step]
            raise ScheduleDeparted(f"--cost-model recorded: step {step} schedules {batch.num_prefill_tokens} prefill "
                                   f"and {batch.num_decode_tokens} decode tokens where the trace recorded {prefill} "
                                   f"and {decode}; recorded times price only the recorded batches (use a cost model "
                                   "fitted to this trace: sim calibrate TRACE -o P.json, then --cost-model P.json)")
        return self.timings[step]

    @property
    def follows_recorded_schedule(self) -> bool:
        return True

    def step_start(self, step: int) -> float | None:
        """When the engine started this step (trace seconds); None past the recorded steps."""
        return self.starts[step] if step < len(self.starts) else None

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, meta={
            "source_trace": self.source, "num_steps": len(self.durations), "median_step_time_s": self.fallback,
            "total_step_time_s": float(sum(self.durations))})


def _split(duration: float, execute: float | None) -> StepTiming:
    """The step's recorded execute time as its device part, the rest as host, where they add up to the
    duration to the bit (the replay's clock must be the recording's); else all of it as device."""
    if execute is None or not 0.0 < execute < duration:
        return StepTiming(duration)
    timing = StepTiming(execute, duration - execute)
    return timing if timing.total == duration else StepTiming(duration)
