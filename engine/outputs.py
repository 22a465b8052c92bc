"""What `LLM.generate` returns, shaped like vLLM's RequestOutput / CompletionOutput."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, kw_only=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Frontend clock (time.monotonic): when the request arrived, saw its first token, finished."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True, kw_only=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = field(default=None)
