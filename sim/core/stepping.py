"""What every simulated step goes through, whichever loop drives it: `launch` schedules, times and
hands a step to the recorder, `CycleRecorder` writes it with the cost model's split of its time."""
from __future__ import annotations

import gc
from contextlib import contextmanager

from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCycle, StepTimes
from sim.cost_models.base import CostModel, StepTiming
from sim.cost_models.batch import batch_from_output
from traces.recorder import TraceRecorder


class CycleRecorder:
    """A TraceRecorder as the step cycle's recorder: a step's row spans the cycle's clock, and its phases
    are the cost model's timing of that step (execute: the device time, sample: the host time), which
    `launch` hands over as it launches the step."""

    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder
        # By id() of the step's SchedulerOutput: async scheduling records steps that launched earlier.
        self._timings: dict[int, StepTiming] = {}

    def timed(self, so: SchedulerOutput, timing: StepTiming) -> None:
        self._timings[id(so)] = timing

    def on_add(self, request: Request) -> None:
        self.recorder.on_add(request)

    def on_abort(self, freed: dict[str, list[int]]) -> list[Request]:
        return self.recorder.on_abort(freed)

    def on_step(self, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes) -> list[Request]:
        timing = self._timings.pop(id(so))
        return self.recorder.on_step(so, outputs, times[0], times[-1], 0.0, timing.device, timing.host)


def launch(cycle: StepCycle, cost_model: CostModel, step: int,
           recorder: CycleRecorder | None) -> tuple[SchedulerOutput, StepTiming]:
    """Schedule and launch the next step and time it (`step`: its index), for every replica: the recorder,
    if the loop writes a trace, keeps the timing until it records the step."""
    so = cycle.begin()
    timing = cost_model.step_time(batch_from_output(so), step)
    if recorder is not None:
        recorder.timed(so, timing)
    return so, timing


@contextmanager
def fewer_collections(threshold: int = 100_000):
    """The loop allocates millions of short-lived objects next to long-lived ones; the default GC
    thresholds rescan the long-lived heap over and over (a third of the run time)."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class SimulationError(RuntimeError):
    """The simulation cannot go on (e.g. waiting requests that can never be scheduled)."""
