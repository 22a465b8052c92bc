"""LLMEngine: the frontend. Text in through the InputProcessor, token ids to the core through the
EngineCoreClient, tokens back through the OutputProcessor as RequestOutputs."""
from __future__ import annotations

import time

from engine.config import EngineArgs, EngineConfig
from engine.core.request import RequestStatus
from engine.core.sampling_params import SamplingParams, as_int
from engine.engine_core import InprocClient
from engine.input_processor import InputProcessor
from engine.output_processor import OutputProcessor
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from engine.tokenizer import get_tokenizer

        self.config = config
        tok_dir = config.model_config.tokenizer_dir
        try:
            self.tokenizer = (get_tokenizer(tok_dir, config.model_config.trust_remote_code)
                              if tok_dir is not None else None)
        except ValueError as e:
            raise ValueError(f"tokenizer: {e}; pass tokenizer=PATH (--tokenizer), or skip_tokenizer_init=True "
                             f"(--skip-tokenizer-init) to serve token-id prompts only") from None
        self.input_processor = InputProcessor(config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = InprocClient(config)
        self._rejected: list[RequestOutput] = []
        self.is_shut_down = False

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config())

    def add_request(self, request_id: str, prompt: str | dict, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0) -> bool:
        """Queue a request; an invalid one becomes a finished error output (returned by the next
        `step`) so it fails alone."""
        if self.is_shut_down:
            raise RuntimeError("LLMEngine: shut down (its trace is finished); build a new LLM to generate again")
        try:
            request, text = self.input_processor.process_inputs(request_id, prompt, params, arrival_time, priority)
        except ValueError as e:
            raw = prompt.get("prompt_token_ids", []) if isinstance(prompt, dict) else []
            raw = raw if isinstance(raw, (list, tuple)) else []
            if len(raw) > self.max_model_len:  # the trace keeps its length, not a copy of its ids
                ids, n = [], len(raw)
            else:
                ids, n = [t for t in map(as_int, raw) if t is not None], None
            self.reject_request(request_id, str(e), arrival_time, prompt if isinstance(prompt, str) else None, ids, n)
            return False
        self.output_processor.add_request(request_id, text, request.prompt_token_ids, request.sampling_params,
                                          request.arrival_time)
        self.engine_core.add_request(request)
        return True

    def reject_request(self, request_id: str, reason: str, arrival_time: float | None = None,
                       prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                       num_prompt_tokens: int | None = None) -> None:
        """End a request the engine will not serve as a finished error output (returned by the next
        `step`), recorded in the trace. `num_prompt_tokens` stands for ids that were never made (a prompt
        refused for its length)."""
        ids = prompt_token_ids or []
        arrival = time.monotonic() if arrival_time is None else arrival_time
        self._rejected.append(RequestOutput(
            request_id=request_id, prompt=prompt, prompt_token_ids=ids,
            outputs=[CompletionOutput(index=0, text="", token_ids=[], finish_reason="error", stop_reason=reason)],
            finished=True, metrics=RequestMetrics(arrival), error=reason))
        self.engine_core.record_rejection(request_id, ids, arrival, reason, num_prompt_tokens)

    def refuse_long_prompt(self, request_id: str, num_prompt_tokens: int, arrival_time: float) -> None:
        self.reject_request(request_id, self.input_processor.length_error(num_prompt_tokens), arrival_time,
                            num_prompt_tokens=num_prompt_tokens)

    @property
    def vocab_size(self) -> int:
        return self.config.model_config.hf_config.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.config.model_config.max_model_len

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the requests that finished in it."""
        finished, self._rejected = self._rejected, []
        core_outputs = self.engine_core.get_output()
        done, to_stop = self.output_processor.process_outputs(core_outputs)
        for request_id, stop_string in to_stop:
            self.engine_core.abort_requests([request_id], RequestStatus.FINISHED_STOPPED, stop_string)
        return finished + done

    def idle(self) -> None:
        """Nothing to step until the next arrival: the trace writes out what it holds meanwhile."""
        self.engine_core.flush_trace()

    def has_unfinished_requests(self) -> bool:
        return bool(self._rejected) or self.output_processor.has_unfinished_requests()

    def shutdown(self, **final_meta) -> None:
        """Close the trace (compacting it) and flush spans; safe to call twice. The engine takes no
        request after it: a closed trace would silently miss them."""
        self.is_shut_down = True
        self.engine_core.shutdown(**final_meta)

    def abort_request(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)
        for rid in request_ids:
            self.output_processor.states.pop(rid, None)
