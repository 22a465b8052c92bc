"""The cost-model seam: the simulator asks how long a step with a given batch takes, and what else the
model can tell. Every capability is declared here; `CostModelDefaults` gives the answer of a model
without it, so the simulator asks and never probes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sim.cost_models.batch import StepBatch

if TYPE_CHECKING:
    from sim.cost_models.intake import Intake


@dataclass(slots=True, frozen=True)
class StepTiming:
    """Seconds of one step cycle: the model on the device, the host phases around it (schedule,
    sampling, applying outputs) and the gap before the next step starts. A synchronous engine pays all
    three in turn; a model that knows only a step's length gives it as `device`."""

    device: float
    host: float = 0.0
    gap: float = 0.0

    @property
    def total(self) -> float:
        return self.device + self.host + self.gap


@dataclass(slots=True, frozen=True)
class DecodeStepTimes:
    """Consecutive decode-only steps timed in one call: each one's device seconds, and the host seconds
    each pays alike (the batch's size does not change); no gap. As StepTimings: (device[j], host)."""

    device: list[float]
    host: float

    def totals(self) -> list[float]:
        """Each step's `StepTiming.total` (its gap, 0, adds nothing)."""
        host = self.host
        return [d + host for d in self.device]


class CostModel(Protocol):
    """`name` goes into the trace's meta; `describe()` into meta too (parameters, fit error...)."""

    name: str

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """How long the step takes, by part; `step` is the step's index (only `recorded` uses it)."""
        ...

    def describe(self) -> dict: ...

    def step_start(self, step: int) -> float | None:
        """When the recorded engine started this step (trace seconds): a recorded replay follows it."""
        ...

    @property
    def intake(self) -> Intake | None:
        """How an idle engine takes in arrivals, where the model measured it."""
        ...

    def decode_step_times(self, num_seqs: int, context_tokens: int, count: int) -> DecodeStepTimes | None:
        """`step_time` of `count` consecutive decode-only steps in one call (the first reading
        `context_tokens` of context, each next one `num_seqs` more); None: ask step by step."""
        ...

    @property
    def max_model_len(self) -> int | None:
        """The model's context length, where the model knows it."""
        ...

    @property
    def has_residuals(self) -> bool:
        """Whether seeded replays differ: the model draws step times from a measured scatter. Without it
        every seed gives the same replay, and `--samples` would report a spread of zero as an interval."""
        ...

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192) -> int | None:
        """KV cache blocks left after the weights, where the model knows the device's memory."""
        ...

    def range_warning(self) -> str | None:
        """One line when the run used the model outside what it was measured or fitted on."""
        ...


class CostModelDefaults:
    """The answers of a cost model without the optional capabilities; concrete models inherit them."""

    intake: Intake | None = None
    max_model_len: int | None = None
    has_residuals: bool = False

    def step_start(self, step: int) -> float | None:
        return None

    def decode_step_times(self, num_seqs: int, context_tokens: int, count: int) -> DecodeStepTimes | None:
        return None

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192) -> int | None:
        return None

    def range_warning(self) -> str | None:
        return None
