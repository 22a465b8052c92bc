"""The cost-model seam: the simulator asks how long a step with a given batch takes."""
from __future__ import annotations

from typing import Protocol

from sim.batch import StepBatch


class CostModel(Protocol):
    """`name` goes into the trace's meta; `describe()` into meta too (parameters, fit error...)."""

    name: str

    def step_time(self, batch: StepBatch, step: int) -> float:
        """Seconds the step takes; `step` is the step's index (only `recorded` uses it)."""
        ...

    def describe(self) -> dict: ...
