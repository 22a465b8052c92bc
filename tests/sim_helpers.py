"""A cost model for simulator tests: fixed step times that order events and need no calibration."""
from __future__ import annotations

from sim.cost_models.base import StepTiming
from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults


class FixedCost(CostModelDefaults):
    """10 ms per step plus 10 us per token."""

    name = "fixed"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.01 + 1e-5 * batch.num_tokens)

    def describe(self) -> dict:
        return {}
