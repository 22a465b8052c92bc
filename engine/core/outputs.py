"""Plain data crossing the core's seams: the model runner's output and what the core hands back per step."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from engine.core.kv_cache_manager import PrefixCacheStats


@dataclass(slots=True)
class LogprobsLists:
    """Per request: the sampled token first, then the top-n; one row per sampled position."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


@dataclass(slots=True)
class MoeStepStats:
    """How one step's tokens were routed, pooled over the model's MoE layers (engine.model_executor.layers.moe
    `routing_counters` says why pooled): what a simulator needs to check its MoE pricing, without per-token
    routing. Distinct experts counted per layer: their most over the layers and their mean; and the most
    tokens any one expert received in any layer."""

    experts_active_max: int
    experts_active_mean: float
    expert_tokens_max: int


@dataclass(slots=True)
class ModelRunnerOutput:
    """One entry per scheduled request; a partial prefill samples nothing (an empty list). `moe_stats` is
    the step's routing in a MoE model, None for a dense one (and for runners that run no model)."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, LogprobsLists] | None = None
    moe_stats: MoeStepStats | None = None


@dataclass(slots=True)
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_preempted_reqs: int = 0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)


class EngineCoreOutput(msgspec.Struct, gc=False):
    """One per request that sampled in a step, so it is built hundreds of times a step: a C struct (as in
    vLLM) costs a quarter of a Python object's construction, and, holding no cycles, stays out of the
    garbage collector's sight."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: LogprobsLists | None = None
    freed_block_ids: list[int] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats | None = None
    moe_stats: MoeStepStats | None = None  # the runner's, passed on for the trace
