"""Frontend output processing: incremental detokenization, stop strings, RequestOutput assembly."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.outputs import EngineCoreOutputs
from engine.core.sampling_params import SamplingParams
from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None


class OutputProcessor:
    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> None:
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop,
                                           params.include_stop_str_in_output, params.skip_special_tokens)
        self.states[request_id] = RequestState(
            request_id, prompt, prompt_token_ids, params, detok, RequestMetrics(arrival_time),
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.states)

    def process_outputs(self, core_outputs: EngineCoreOutputs) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """Finished RequestOutputs, and (request_id, stop string) pairs the core must now stop."""
        now = time.monotonic()
        finished: list[RequestOutput] = []
        to_stop: list[tuple[str, str]] = []
        for out in core_outputs.outputs:
            state = self.states.get(out.request_id)
            if state is None:
                continue
            if out.new_token_ids and state.metrics.first_token_time is None:
                state.metrics.first_token_time = now
            state.token_ids.extend(out.new_token_ids)
            if out.new_logprobs is not None and state.logprobs is not None:
                cumulative = state.cumulative_logprob or 0.0  # set with logprobs, at 0.0
                for ids, lps in zip(out.new_logprobs.token_ids, out.new_logprobs.logprobs):
                    state.logprobs.append(dict(zip(ids, lps)))
                    cumulative += lps[0]
                state.cumulative_logprob = cumulative
            reason, stop_reason = out.finish_reason, out.stop_reason
            if state.detokenizer is not None and out.new_token_ids:
                stop_terminated = reason == "stop" and not state.params.include_stop_str_in_output
                matched = state.detokenizer.update(out.new_token_ids, stop_terminated)
                if matched is not None and reason is None:
                    reason, stop_reason = "stop", matched
                    to_stop.append((out.request_id, matched))
            if reason is not None:
                state.metrics.finished_time = now
                finished.append(self._make_output(state, reason, stop_reason, out.num_cached_tokens))
                del self.states[out.request_id]
        return finished, to_stop

    def _make_output(self, state: RequestState, reason: str, stop_reason: int | str | None,
                     num_cached_tokens: int) -> RequestOutput:
        text = state.detokenizer.get_next_output_text(True, False) if state.detokenizer else ""
        completion = CompletionOutput(index=0, text=text, token_ids=state.token_ids,
                                      cumulative_logprob=state.cumulative_logprob, logprobs=state.logprobs,
                                      finish_reason=reason, stop_reason=stop_reason)
        error = stop_reason if reason == "error" and isinstance(stop_reason, str) else None
        return RequestOutput(request_id=state.request_id, prompt=state.prompt, prompt_token_ids=state.prompt_token_ids,
                             outputs=[completion], finished=True, metrics=state.metrics,
                             num_cached_tokens=num_cached_tokens, error=error)
