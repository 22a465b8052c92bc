"""The simulator's stand-in for the model runner: no model, just the tokens a step samples.

A request samples one token in a step that computes its last known token (a full prefill or a
decode), as the engine's runner does. The token is the source trace's recorded one when there is one
(so stop tokens and lengths match), otherwise a deterministic id derived from the seed, the request and
the position, so the same inputs always give the same trace.
"""
from __future__ import annotations

import zlib
from collections import deque
from typing import TypeVar

import numpy as np

from engine.core.outputs import ModelRunnerOutput
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput

FIRST_TOKEN_ID = 3  # leave the special ids (BOS/EOS/PAD) alone, as the workloads do
_MULTIPLIER = 2654435761  # Knuth's multiplicative hash: consecutive positions land far apart
# What a partial prefill samples; one shared list, since the scheduler only reads sampled tokens.
_NOTHING: list[int] = []


class FakeModelRunner:
    """Register each request's recorded outputs (if any) when it is added; `forget` it when it ends."""

    def __init__(self, seed: int = 0, vocab_size: int = 32000, requests: dict[str, Request] | None = None) -> None:
        self.seed = seed
        self.span = max(1, vocab_size - FIRST_TOKEN_ID)
        self._recorded: dict[str, list[int]] = {}
        self._base: dict[str, int] = {}
        self.requests = requests if requests is not None else {}
        self._in_flight: deque[ModelRunnerOutput] = deque()

    # The StepCycle's runner protocol: tokens are decided when the batch is launched (what the scheduler
    # knows then), and handed back in launch order.
    def execute_model(self, so: SchedulerOutput) -> None:
        self._in_flight.append(self.execute(so, self.requests))

    def sample_tokens(self) -> ModelRunnerOutput:
        return self._in_flight.popleft()

    def register(self, request_id: str, output_token_ids: list[int] | None = None) -> None:
        if output_token_ids:
            self._recorded[request_id] = output_token_ids
        self._base[request_id] = zlib.crc32(request_id.encode()) ^ (self.seed * 0x9E3779B1 & 0xFFFFFFFF)

    def forget(self, request_id: str) -> None:
        self._recorded.pop(request_id, None)
        self._base.pop(request_id, None)

    def upcoming(self, requests: list[Request], count: int) -> list[list[int]]:
        """The tokens `execute` would sample for each request at its next `count` output positions (a
        decode run's). Without recorded tokens, the formula over the whole batch at once, in numpy:
        positions stay far below 2**31, so nothing overflows int64."""
        if self._recorded:
            token_at = self.token_at
            return [[token_at(rid, pos) for pos in range(first, first + count)]
                    for rid, first in ((r.request_id, len(r.output_token_ids)) for r in requests)]
        base = self._base
        n = len(requests)
        bases = np.fromiter((base[r.request_id] for r in requests), np.int64, n)
        firsts = np.fromiter((len(r.output_token_ids) for r in requests), np.int64, n)
        positions = firsts[:, None] + np.arange(count, dtype=np.int64)
        return _token(bases[:, None], positions, self.span).tolist()

    def token_at(self, request_id: str, position: int) -> int:
        """The token a request samples at an output position: its recorded one, else the seed's."""
        rec = self._recorded.get(request_id)
        if rec is not None and position < len(rec):
            return rec[position]
        return _token(self._base[request_id], position, self.span)

    def execute(self, so: SchedulerOutput, requests: dict[str, Request]) -> ModelRunnerOutput:
        """One token for each request whose prompt is now computed, none for a partial prefill; the
        scheduler applies them in its own order, so row order is free. Under async scheduling the
        computed count already includes the placeholders of steps in flight."""
        ids = list(so.num_scheduled_tokens)
        if self._recorded:
            token_at = self.token_at
            return ModelRunnerOutput(ids, [
                _NOTHING if (req := requests[rid]).is_prefill_chunk
                else [token_at(rid, req.num_computed_tokens - len(req.prompt_token_ids))] for rid in ids])
        base, span = self._base, self.span  # a generated workload: every token is the seed's
        return ModelRunnerOutput(ids, [
            _NOTHING if (req := requests[rid]).is_prefill_chunk
            else [_token(base[rid], req.num_computed_tokens - len(req.prompt_token_ids), span)] for rid in ids])


Positions = TypeVar("Positions", int, np.ndarray)


def _token(base: Positions, position: Positions, span: int) -> Positions:
    """The token sampled at an output position without a recorded one, for ints and numpy arrays alike."""
    return FIRST_TOKEN_ID + (base + position * _MULTIPLIER) % span
