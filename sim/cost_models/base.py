"""The cost-model seam: the simulator asks how long a step with a given batch takes, and what else the
model can tell. Every capability is declared here; `CostModelDefaults` gives the answer of a model
without it, so the simulator and the CLI ask and never probe a model's name or class."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

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


@dataclass(slots=True, frozen=True, kw_only=True)
class CostModelInfo:
    """What a cost model says of itself. The typed fields are what a run is labelled by: `model` and
    `hardware` the model and device it prices (where it knows them), `fitted_model` the traced model's
    entry a fitted law was fitted on. `meta` is the rest, kept whole in the trace's meta (`to_meta`)."""

    name: str
    model: str | None = None
    hardware: str | None = None
    fitted_model: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()  # what the model left out of what it was given, one line each, for the user
    meta: dict[str, Any] = field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        """The trace's `cost_model` entry."""
        return {"name": self.name, **self.meta}


class CostModel(Protocol):
    """A step's price and what the model declares of itself; `describe()` goes into the trace's meta."""

    name: str

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """How long the step takes, by part; `step` is the step's index (only `recorded` uses it)."""
        ...

    def describe(self) -> CostModelInfo: ...

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

    @property
    def follows_recorded_schedule(self) -> bool:
        """Whether the model prices only the steps a trace recorded: a replay on it is that run (its model,
        device and step starts), and any flag that changes the schedule is refused."""
        ...

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int | None:
        """KV cache blocks left after the weights, where the model knows the device's memory (or in
        `kv_cache_memory` bytes, vLLM's --kv-cache-memory-bytes, where given)."""
        ...

    def range_warning(self) -> str | None:
        """One line when the run used the model outside what it was measured or fitted on."""
        ...


class CostModelDefaults:
    """The answers of a cost model without the optional capabilities; concrete models inherit them."""

    @property
    def intake(self) -> Intake | None:
        return None

    @property
    def max_model_len(self) -> int | None:
        return None

    @property
    def has_residuals(self) -> bool:
        return False

    @property
    def follows_recorded_schedule(self) -> bool:
        return False

    def step_start(self, step: int) -> float | None:
        return None

    def decode_step_times(self, num_seqs: int, context_tokens: int, count: int) -> DecodeStepTimes | None:
        return None

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int | None:
        return None

    def range_warning(self) -> str | None:
        return None
