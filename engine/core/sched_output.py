"""What the scheduler tells the workers each step, diff-based as in vLLM v1.

A request's first scheduling carries its prompt and block ids (`NewRequestData`); afterwards only
what changed travels (`CachedRequestData`): new block ids and the computed-token count, or for a request
resumed after preemption its whole token list and fresh block table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from engine.core.sampling_params import SamplingParams


# One shared list for the many requests that gain no block in a step: readers never mutate new_block_ids
# entries, and one list instead of one per decode keeps the garbage collector's young generation small.
NO_BLOCK_IDS: list[int] = []


# Units of (needed, available): blocks for kv_short/full_sequence, tokens for no_chunk, none (0, 0) otherwise.
ADMISSION_STOP_REASONS = ("token_budget", "max_num_seqs", "kv_short", "full_sequence", "no_chunk", "preempted")


@dataclass(slots=True)
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None = None


@dataclass(slots=True)
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    resumed_token_ids: list[list[int] | None] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    """`num_computed_tokens` in the request data is the count before this step's tokens."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: list[str] = field(default_factory=list)
    preempted_block_ids: dict[str, list[int]] = field(default_factory=dict)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    prefix_hit_tokens: int = 0
    decode_req_ids: set[str] = field(default_factory=set)
    # Why the waiting queue stopped being admitted: (request id at its front, reason, needed, available),
    # reason one of ADMISSION_STOP_REASONS; None when nobody was left waiting. Set only where the loop breaks.
    admission_stop: tuple[str, str, int, int] | None = None
    # For each preempted request: (the running request whose allocation forced it, blocks needed, free).
    preempted_for: dict[str, tuple[str, int, int]] | None = None

    def phase(self, req_id: str) -> str:
        return "decode" if req_id in self.decode_req_ids else "prefill"
