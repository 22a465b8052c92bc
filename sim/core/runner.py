"""The simulator's stand-in for the model runner: no model, just the tokens a step samples.

A request samples one token in a step that computes its last known token (a full prefill or a
decode), as the engine's runner does. The token is the source trace's recorded one when there is one
(so stop tokens and lengths match), otherwise a deterministic id derived from the seed, the request and
the position, so the same inputs always give the same trace.
"""
from __future__ import annotations

import zlib
from collections import deque

import numpy as np

from engine.core.outputs import ModelRunnerOutput
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput

FIRST_TOKEN_ID = 3  # leave the special ids (BOS/EOS/PAD) alone, as the workloads do
_MULTIPLIER = 2654435761  # Knuth's multiplicative hash: consecutive positions land far apart
# What a partial prefill samples; one shared list, since the scheduler only reads sampled tokens.
_NOTHING: list[int] = []
# A decode run's tokens below this many are drawn in Python: numpy's fixed cost is larger there.
_BATCHED_TOKENS = 64


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
        decode run's). Without recorded tokens, one numpy expression for the whole batch where it is
        large enough to pay for itself: positions stay far below 2**31, so nothing overflows int64."""
        if self._recorded or len(requests) * count < _BATCHED_TOKENS:
            return [self._upcoming(r.request_id, len(r.output_token_ids), count) for r in requests]
        base = self._base
        n = len(requests)
        bases = np.fromiter((base[r.request_id] for r in requests), np.int64, n)
        firsts = np.fromiter((len(r.output_token_ids) for r in requests), np.int64, n)
        positions = firsts[:, None] + np.arange(count, dtype=np.int64)
        return ((bases[:, None] + positions * _MULTIPLIER) % self.span + FIRST_TOKEN_ID).tolist()

    def _upcoming(self, request_id: str, first_pos: int, count: int) -> list[int]:
        rec = self._recorded.get(request_id)
        tokens = rec[first_pos:first_pos + count] if rec is not None else []
        base, span = self._base[request_id], self.span
        tokens += [FIRST_TOKEN_ID + (base + pos * _MULTIPLIER) % span
                   for pos in range(first_pos + len(tokens), first_pos + count)]
        return tokens

    def execute(self, so: SchedulerOutput, requests: dict[str, Request]) -> ModelRunnerOutput:
        """One token for each request whose prompt is now computed (its recorded one when known), none
        for a partial prefill; the scheduler applies them in its own order, so row order is free."""
        ids = list(so.num_scheduled_tokens)
        base, span = self._base, self.span
        recorded = self._recorded
        if not recorded:  # a generated workload: every token comes from the hash, one comprehension
            return ModelRunnerOutput(ids, [
                _NOTHING if (req := requests[rid]).is_prefill_chunk
                else [FIRST_TOKEN_ID + (base[rid] + (req.num_computed_tokens - len(req.prompt_token_ids))
                                        * _MULTIPLIER) % span] for rid in ids])
        sampled: list[list[int]] = []
        for rid in ids:
            req = requests[rid]
            if req.is_prefill_chunk:
                sampled.append(_NOTHING)
                continue
            # The sampled token's output position; under async scheduling the computed count already
            # includes the placeholders of steps in flight.
            pos = req.num_computed_tokens - len(req.prompt_token_ids)
            rec = recorded.get(rid)
            if rec is not None and pos < len(rec):
                sampled.append([rec[pos]])
            else:
                sampled.append([FIRST_TOKEN_ID + (base[rid] + pos * _MULTIPLIER) % span])
        return ModelRunnerOutput(ids, sampled)
