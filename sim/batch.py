"""What a cost model sees of one step: the batch's shape, derived from the scheduler's output alone
(or, for calibration, from a trace's decisions table: the same numbers)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.sched_output import SchedulerOutput


@dataclass(slots=True)
class StepBatch:
    """Token counts and attention work of one step.

    `context_tokens` sums, over scheduled requests, the context each one attends to after this step
    (computed before + scheduled): the KV bytes read. `prefill_attention` sums q_len * (computed
    before + (q_len + 1) / 2) over prefill chunks: the causal attention FLOPs, up to a constant.
    """

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    context_tokens: int = 0
    prefill_attention: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    def add(self, num_tokens: int, num_computed_before: int, decode: bool) -> None:
        self.context_tokens += num_computed_before + num_tokens
        if decode:
            self.num_decode_tokens += num_tokens
            self.num_decode_seqs += 1
        else:
            self.num_prefill_tokens += num_tokens
            self.num_prefill_seqs += 1
            self.prefill_attention += num_tokens * (num_computed_before + (num_tokens + 1) / 2)


def batch_from_output(so: SchedulerOutput) -> StepBatch:
    batch = StepBatch()
    tokens = so.num_scheduled_tokens
    for new in so.scheduled_new_reqs:
        batch.add(tokens[new.req_id], new.num_computed_tokens, False)
    cached = so.scheduled_cached_reqs
    decodes = so.decode_req_ids
    for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
        batch.add(tokens[rid], computed, rid in decodes)
    return batch
