"""What the scheduler tells the workers each step, diff-based as in vLLM v1.

A request's first scheduling carries its prompt and block ids (`NewRequestData`); afterwards only
what changed travels (`CachedRequestData`): new block ids and the computed-token count, or for a request
resumed after preemption its whole token list and fresh block table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.block_pool import KVCacheBlock
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.request import Request

# One shared (never mutated) list for the many requests that gained no block in a step.
_NO_BLOCK_IDS: list[int] = []


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


def make_scheduler_output(kv: KVCacheManager, scheduled_new: list[Request], scheduled_resumed: list[Request],
                          scheduled_running: list[Request], new_blocks_of: dict[str, list[KVCacheBlock]],
                          num_scheduled: dict[str, int], preempted: list[Request],
                          preempted_block_ids: dict[str, list[int]], prefix_hit_tokens: int,
                          finished: set[str]) -> SchedulerOutput:
    """Package the step before num_computed_tokens advances, so request data shows the old counts."""
    new_reqs = [NewRequestData(r.request_id, r.prompt_token_ids, r.sampling_params,
                               kv.get_block_ids(r.request_id), r.num_computed_tokens, r.eos_token_id)
                for r in scheduled_new]
    n = len(scheduled_running)
    run_ids = [r.request_id for r in scheduled_running]
    cached = CachedRequestData(
        run_ids, [False] * n, [None] * n,
        [[b.block_id for b in new_blocks_of[rid]] if rid in new_blocks_of else _NO_BLOCK_IDS for rid in run_ids],
        [r.num_computed_tokens for r in scheduled_running])
    # A decode computes the one token after everything computed so far, and it is an output token.
    decode_ids = {r.request_id for r in scheduled_running
                  if r.num_computed_tokens == len(r.all_token_ids) + r.num_output_placeholders - 1
                  and (r.output_token_ids or r.num_output_placeholders)}
    num_decode_tokens = len(decode_ids)  # a decode has exactly one token left, so it is scheduled one
    for req in scheduled_resumed:
        cached.req_ids.append(req.request_id)
        cached.resumed_from_preemption.append(True)
        cached.resumed_token_ids.append(list(req.all_token_ids))
        cached.new_block_ids.append(kv.get_block_ids(req.request_id))
        cached.num_computed_tokens.append(req.num_computed_tokens)
    total = sum(num_scheduled.values())
    return SchedulerOutput(
        scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached, num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=total, finished_req_ids=finished,
        preempted_req_ids=[r.request_id for r in preempted], preempted_block_ids=preempted_block_ids,
        num_prefill_tokens=total - num_decode_tokens, num_decode_tokens=num_decode_tokens,
        prefix_hit_tokens=prefix_hit_tokens, decode_req_ids=decode_ids)
