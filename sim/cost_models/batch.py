"""What a cost model sees of one step: the batch's shape, derived from the scheduler's output alone
(or, for calibration, from a trace's decisions table: the same numbers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.sched_output import SchedulerOutput


def causal_pairs(num_tokens: Any, num_computed_before: Any) -> Any:
    """Query-key pairs of a causal prefill chunk: each of its `num_tokens` queries attends to everything
    computed before it and to itself. Numbers or numpy arrays alike."""
    return num_tokens * (num_computed_before + (num_tokens + 1) / 2)


@dataclass(slots=True)
class StepBatch:
    """Token counts and attention work of one step.

    `context_tokens` sums, over scheduled requests, the context each one attends to after this step
    (computed before + scheduled): the KV bytes read. `prefill_attention` sums `causal_pairs` over
    prefill chunks: the causal attention FLOPs, up to a constant.
    Per-kernel cost models also read each prefill chunk (new tokens, computed before) and the range of
    the decodes' contexts (attention over uneven contexts costs more than over their mean).
    """

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    context_tokens: int = 0
    prefill_attention: float = 0.0
    # Detail for per-kernel models; a batch rebuilt from a trace's step table lacks it, so it is not compared.
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list, compare=False)
    decode_context_min: int = field(default=0, compare=False)
    decode_context_max: int = field(default=0, compare=False)
    # Data parallelism: the tokens every rank of the group sends through the shared MoE layers, and the
    # count this rank's kernels are padded to (vLLM pads each rank to the group's largest); 0: its own.
    moe_tokens: int = field(default=0, compare=False)
    padded_tokens: int = field(default=0, compare=False)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    def add(self, num_tokens: int, num_computed_before: int, decode: bool) -> None:
        self.context_tokens += num_computed_before + num_tokens
        if decode:
            context = num_computed_before + num_tokens
            if not self.num_decode_seqs or context < self.decode_context_min:
                self.decode_context_min = context
            self.decode_context_max = max(self.decode_context_max, context)
            self.num_decode_tokens += num_tokens
            self.num_decode_seqs += 1
        else:
            self.num_prefill_tokens += num_tokens
            self.num_prefill_seqs += 1
            self.prefill_attention += causal_pairs(num_tokens, num_computed_before)
            self.prefill_chunks.append((num_tokens, num_computed_before))


def batch_from_output(so: SchedulerOutput) -> StepBatch:
    """The batch of one step. A decode adds one token and no prefill attention, so only the prefill
    rows (new, resumed, chunked) are walked; the context sum over every row is one `sum`. Prefill
    attention adds up in the rows' order (new requests, then cached ones), as `StepBatch.add` would,
    so the float is the same to the bit. The decodes' context range is taken over every cached row (a
    chunked prefill continuing among them widens it a little)."""
    tokens = so.num_scheduled_tokens
    cached = so.scheduled_cached_reqs
    decodes = so.decode_req_ids
    context = so.total_num_scheduled_tokens + sum(cached.num_computed_tokens)
    prefill_tokens = prefill_seqs = 0
    attention = 0.0
    chunks = []
    for new in so.scheduled_new_reqs:
        n, computed = tokens[new.req_id], new.num_computed_tokens
        context += computed
        prefill_tokens += n
        prefill_seqs += 1
        attention += causal_pairs(n, computed)
        chunks.append((n, computed))
    if len(cached.req_ids) > len(decodes):
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid not in decodes:
                n = tokens[rid]
                prefill_tokens += n
                prefill_seqs += 1
                attention += causal_pairs(n, computed)
                chunks.append((n, computed))
    low = high = 0
    if decodes:
        low, high = min(cached.num_computed_tokens) + 1, max(cached.num_computed_tokens) + 1
    return StepBatch(prefill_tokens, so.total_num_scheduled_tokens - prefill_tokens, prefill_seqs, len(decodes),
                     context, attention, chunks, low, high)
