"""Scheduler and cache configuration: the part of the engine config that the simulator shares."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.core.flags import Flag, flags_of, option

POLICIES = ("fcfs", "priority")
# Past these a value is a typo: a context of 2^30 tokens, 2^20 sequences in a step, 2^26 KV blocks (each
# a Python object once handed out or shown in a block snapshot) are beyond any deployment simulated here.
MAX_TOKENS = 1 << 30
MAX_SEQS = 1 << 20
MAX_BLOCKS = 1 << 26


def _check(cond: bool, field: str, why: str, value: object) -> None:
    if not cond:
        raise ValueError(f"{field}: {why}, got {value!r}")


@dataclass(slots=True)
class SchedulerConfig:
    """vLLM's scheduler knobs under vLLM's names and vLLM 0.32's defaults; `max_num_batched_tokens` is
    the per-step token budget. The `option` fields are the engine's and the simulator's flags.

    `scheduler_reserve_full_isl` (vLLM 0.32, on by default; absent before) admits a waiting request only
    when the free blocks hold its whole current sequence, not just its first chunk. `async_scheduling`
    (vLLM 0.32 AsyncScheduler with a batch queue of two; on by default where the platform allows it,
    off on CPU) schedules step k+1 before step k's tokens are known.
    """

    max_model_len: int = option(4096, "context length (default: the model's)")
    max_num_seqs: int = option(256, "max requests in one step")
    max_num_batched_tokens: int | None = option(None, "token budget per step (default: 8192, or max_model_len "
                                                "without chunked prefill)")
    enable_chunked_prefill: bool = option(True, "split long prompts over steps")
    long_prefill_token_threshold: int = option(0, "cap tokens per prefill chunk (0: off)")
    policy: str = option("fcfs", "order of the waiting queue", flag="--scheduling-policy", choices=POLICIES)
    # `sim plan` takes neither mode: its cluster replicas run synchronously.
    scheduler_reserve_full_isl: bool = option(
        True, "admit a request only when its whole sequence fits in the free KV blocks (vLLM 0.32 default: on)",
        sim="replay")
    async_scheduling: bool = option(
        False, "schedule step k+1 before step k's tokens are known (vLLM 0.32 AsyncScheduler; engine default as "
        "vLLM: on for cuda, off for cpu)", sim=True)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None:
            # Without chunking a whole prompt must fit in one step.
            self.max_num_batched_tokens = 8192 if self.enable_chunked_prefill else max(self.max_model_len, 8192)
        _check(isinstance(self.max_model_len, int) and 1 <= self.max_model_len <= MAX_TOKENS, "max_model_len",
               f"must be an int in [1, {MAX_TOKENS}]", self.max_model_len)
        _check(isinstance(self.max_num_seqs, int) and 1 <= self.max_num_seqs <= MAX_SEQS, "max_num_seqs",
               f"must be an int in [1, {MAX_SEQS}]", self.max_num_seqs)
        _check(isinstance(self.max_num_batched_tokens, int) and 1 <= self.max_num_batched_tokens <= MAX_TOKENS,
               "max_num_batched_tokens", f"must be an int in [1, {MAX_TOKENS}]", self.max_num_batched_tokens)
        _check(0 <= self.long_prefill_token_threshold <= MAX_TOKENS, "long_prefill_token_threshold",
               f"must be in [0, {MAX_TOKENS}]", self.long_prefill_token_threshold)
        _check(self.policy in POLICIES, "policy", f"must be one of {POLICIES}", self.policy)
        if not self.enable_chunked_prefill:
            _check(self.max_num_batched_tokens >= self.max_model_len, "max_num_batched_tokens",
                   f"must be >= max_model_len ({self.max_model_len}) when chunked prefill is off",
                   self.max_num_batched_tokens)

    @property
    def token_budget(self) -> int:
        """The token budget per step, `max_num_batched_tokens` as construction resolved it."""
        if self.max_num_batched_tokens is None:
            raise ValueError("SchedulerConfig.max_num_batched_tokens: unresolved (set after construction)")
        return self.max_num_batched_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class CacheConfig:
    """Paged KV cache shape as the scheduler sees it; block 0 is the null block, so usable = num_gpu_blocks - 1."""

    block_size: int = option(16, "tokens per KV block")
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool = option(True, "reuse KV of shared prefixes")
    watermark: float = 0.0
    # vLLM 0.32 defaults to 0.92; 0.9 is kept so simulated KV sizes and plan results files stay comparable.
    gpu_memory_utilization: float = option(0.9, "share of device memory for the engine (the roofline cost "
                                           "model sizes the simulated KV cache with it)")
    num_gpu_blocks_override: int | None = option(None, "force the KV block count")
    kv_cache_memory: int | None = option(None, "KV cache bytes (CPU default 512 MiB)", sim=False)

    def __post_init__(self) -> None:
        _check(isinstance(self.block_size, int) and 1 <= self.block_size <= MAX_TOKENS, "block_size",
               f"must be an int in [1, {MAX_TOKENS}]", self.block_size)
        _check(self.num_gpu_blocks is None or 2 <= self.num_gpu_blocks <= MAX_BLOCKS, "num_gpu_blocks",
               f"must be in [2, {MAX_BLOCKS}] (one is the null block)", self.num_gpu_blocks)
        _check(0.0 <= self.watermark < 1.0, "watermark", "must be in [0, 1)", self.watermark)
        _check(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "must be in (0, 1]",
               self.gpu_memory_utilization)
        _check(self.num_gpu_blocks_override is None or 2 <= self.num_gpu_blocks_override <= MAX_BLOCKS,
               "num_gpu_blocks_override", f"must be in [2, {MAX_BLOCKS}]", self.num_gpu_blocks_override)
        _check(self.kv_cache_memory is None or self.kv_cache_memory > 0, "kv_cache_memory", "must be > 0 bytes",
               self.kv_cache_memory)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_flags() -> tuple[Flag, ...]:
    """The scheduler and cache options `engine run` shares with `sim replay` and `sim plan`."""
    return flags_of(SchedulerConfig) + flags_of(CacheConfig)
