"""Per-request sampling and stopping parameters (vLLM's SamplingParams, trimmed to what we serve)."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import SupportsIndex, TypeVar

T = TypeVar("T")

_GREEDY_EPS = 1e-5
# vLLM's API bounds a seed to a signed 64-bit int (the range torch.Generator.manual_seed takes without
# wrapping), and reads -1 as "no seed".
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def as_int(value: object) -> int | None:
    """`value` as a plain int if it is an integer (numpy integers included), else None; a bool is not an
    integer here, so `True` is never taken for token id 1."""
    if value is None or isinstance(value, bool):  # numpy's bool has no __index__: operator.index refuses it
        return None
    if isinstance(value, int):
        return value
    return operator.index(value) if isinstance(value, SupportsIndex) else None


def _plain(value: T) -> T | int:
    """numpy integers become ints; anything else is left for `verify` to judge."""
    n = as_int(value)
    return value if n is None else n


@dataclass(slots=True)
class SamplingParams:
    """Validated on construction so a bad request fails alone, with the field named."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [_plain(t) for t in self.stop_token_ids or []]
        self.seed = _plain(self.seed)
        if self.seed == -1:
            self.seed = None
        self.verify()

    def verify_token_ids(self, vocab_size: int) -> None:
        """Token ids in the params must name a row of the model's logits (known only once the model is)."""
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.stop_token_ids: {bad[0]} is outside the vocabulary "
                             f"[0, {vocab_size})")

    def verify(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}: {why}, got {getattr(self, name)!r}")

        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(name, "must be a number")
        if self.n != 1:
            raise bad("n", "only n=1 is supported")
        if not self.temperature >= 0.0:
            raise bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be an int, -1 or 0 to disable, or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if self.seed is not None and (as_int(self.seed) is None or not SEED_MIN <= self.seed <= SEED_MAX):
            raise bad("seed", f"must be an int in [{SEED_MIN}, {SEED_MAX}] (-1: none) or None")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "must be an int >= 1 or None")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must not exceed max_tokens ({self.max_tokens})")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if any(as_int(t) is None or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative ints (not bools)")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", "must be an int >= 0 or None")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
