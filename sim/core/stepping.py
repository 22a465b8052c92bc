"""What every simulated step goes through, whichever loop drives it: `launch` schedules, prices and
launches it."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCycle
from sim.cost_models.base import CostModel, StepTiming
from sim.cost_models.batch import batch_from_output


def launch(cycle: StepCycle, cost_model: CostModel, step: int) -> tuple[SchedulerOutput, StepTiming]:
    """Schedule and launch the next step and price it (`step`: its index); the price travels with the
    step in flight, to the recorder when it finishes."""
    entry = cycle.begin()
    timing = cost_model.step_time(batch_from_output(entry.so), step)
    entry.cost = timing
    return entry.so, timing


@contextmanager
def fewer_collections(threshold: int = 100_000) -> Iterator[None]:
    """The loop allocates millions of short-lived objects next to long-lived ones; the default GC
    thresholds rescan the long-lived heap over and over."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class SimulationError(RuntimeError):
    """The simulation cannot go on (e.g. waiting requests that can never be scheduled)."""
