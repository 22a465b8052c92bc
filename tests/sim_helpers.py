"""A cost model for simulator tests: fixed step times that order events and need no calibration."""
from __future__ import annotations

from sim.cost_models.base import CostModelInfo, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults


class FixedCost(CostModelDefaults):
    """10 ms per step plus 10 us per token."""

    name = "fixed"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.01 + 1e-5 * batch.num_tokens)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


class FlatCost(CostModelDefaults):
    """10 ms per step whatever it holds: a model with no measured scatter."""

    name = "flat"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.01)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


# Three 600-token prompts, 4 output tokens each: a replay that takes a moment.
TINY_WORKLOAD = """name: tiny
seed: 1
num_requests: 3
arrival: {process: constant, rate: 20.0}
prompt_tokens: {dist: fixed, value: 600}
output_tokens: {dist: fixed, value: 4}
"""


def one_line(e: BaseException) -> str:
    """An error's text, asserted to be one line (bad input gets one clear line)."""
    text = str(e)
    assert "\n" not in text.strip()
    return text
