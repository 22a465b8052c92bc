"""Frontend input processing: tokenize, validate against the model, fill defaults (vLLM's InputProcessor)."""
from __future__ import annotations

import time
from typing import Any

from engine.config import EngineConfig
from engine.core.sampling_params import SamplingParams, as_int
from engine.engine_core import EngineCoreRequest


class InputProcessor:
    def __init__(self, config: EngineConfig, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = config.model_config.max_model_len
        self.vocab_size = config.model_config.hf_config.vocab_size
        self.eos_token_id = config.model_config.eos_token_id
        self.why_no_tokenizer = ("the engine was started with skip_tokenizer_init=True"
                                 if config.model_config.skip_tokenizer_init else "this model has none")
        self.max_prompt_chars = None if tokenizer is None else self.max_model_len * _max_token_chars(tokenizer) * 4

    def process_inputs(self, request_id: str, prompt: str | dict, params: SamplingParams | None,
                       arrival_time: float | None = None, priority: int = 0) -> tuple[EngineCoreRequest, str | None]:
        """Raise ValueError naming the request and the field for a request that cannot be served;
        return it otherwise. Everything that could fail inside a model step is checked here."""
        try:
            params, text, ids = self._validate(prompt, params)
        except ValueError as e:
            raise ValueError(f"request {request_id}: {e}") from None
        return EngineCoreRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=params,
                                 eos_token_id=self.eos_token_id, priority=priority,
                                 arrival_time=time.monotonic() if arrival_time is None else arrival_time), text

    def _validate(self, prompt: str | dict, params: SamplingParams | None
                  ) -> tuple[SamplingParams, str | None, list[int]]:
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(params).__name__}")
        params.verify()  # again: the dataclass may have been changed since it was built
        params.verify_token_ids(self.vocab_size)
        if params.stop and self.tokenizer is None:
            raise ValueError(f"SamplingParams.stop: stop strings need a tokenizer and {self.why_no_tokenizer}; "
                             f"use stop_token_ids")
        text, ids = self._tokens(prompt)
        if not ids:
            raise ValueError("prompt: is empty")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        self._check_length(len(ids))
        return params, text, ids

    def length_error(self, num_tokens: int) -> str:
        return f"prompt: {num_tokens} tokens is longer than max_model_len={self.max_model_len}"

    def _check_length(self, num_tokens: int) -> None:
        if num_tokens > self.max_model_len:
            raise ValueError(self.length_error(num_tokens))

    def _tokens(self, prompt: str | dict) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt: text needs a tokenizer and {self.why_no_tokenizer}; "
                                 f"pass {{'prompt_token_ids': [...]}}")
            if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
                raise ValueError(f"prompt: {len(prompt):,} characters are more tokens than max_model_len="
                                 f"{self.max_model_len} whatever they say; not tokenized")
            try:
                return prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
            except (TypeError, ValueError) as e:  # e.g. a lone surrogate, which no UTF-8 tokenizer takes
                raise ValueError(f"prompt: the tokenizer cannot encode it ({' '.join(str(e).split())})") from None
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if hasattr(ids, "tolist") and getattr(ids, "ndim", None) == 1:  # a numpy array
                ids = ids.tolist()
            if not isinstance(ids, (list, tuple)):
                raise ValueError(f"prompt_token_ids: must be a list of ints, got {type(ids).__name__}")
            self._check_length(len(ids))  # before a Python int per token is made
            plain: list[int] = []
            for i, t in enumerate(ids):
                n = as_int(t)
                if n is None:
                    raise ValueError(f"prompt_token_ids[{i}]: {t!r} is not a token id (an int, not a bool)")
                plain.append(n)
            return prompt.get("prompt"), plain
        raise ValueError(f"prompt: expected a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")


def _max_token_chars(tokenizer: Any) -> int:
    """The most characters of text one token stands for: no token covers more characters than its own
    string has (a byte-level token's characters are bytes; a metaspace token's include its space). The
    prompt bound above allows 4x that, for normalizers that shrink the text before it is split."""
    return max(map(len, tokenizer.get_vocab()), default=1)
