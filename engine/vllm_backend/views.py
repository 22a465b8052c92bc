"""vLLM's scheduler objects seen through the names `traces.recorder.TraceRecorder` reads, so the
project's one recorder writes vLLM runs too (no second trace writer to keep in step with the format)."""
from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from engine.core.kv_cache_manager import BlockEvent
from engine.core.sampling_params import SamplingParams
from engine.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput

# The recorder reads no sampling parameters from a step's new requests: one default stands in for them all.
_UNREAD_PARAMS = SamplingParams()


@dataclass(slots=True)
class RecordedRequest:
    """What the trace's `requests` table holds about one vLLM request, on the recorder's monotonic clock."""

    request_id: str
    arrival_time: float
    queued_time: float
    num_prompt_tokens: int
    prompt_token_ids: list[int]
    max_tokens: int | None
    priority: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    finish_reason: str | None = None
    error: str | None = None
    # vLLM's own Request: its output tokens are read once, when it ends, rather than gathered every step.
    source: Any = None

    def take_outputs(self) -> None:
        """The output tokens so far, from vLLM's Request, which is let go of then (vLLM has dropped it)."""
        if self.source is not None:
            self.output_token_ids = list(self.source.output_token_ids)
            self.source = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def get_finish_reason(self) -> str | None:
        return self.finish_reason


class PoolView:
    """vLLM's BlockPool: block 0 is its null block too, so the usable count is num_gpu_blocks - 1. The
    free count is the one after the step being written (`num_free`), which rows are built after."""

    __slots__ = ("pool", "num_usable_blocks", "blocks", "num_free")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.num_usable_blocks = pool.num_gpu_blocks - 1
        self.blocks = pool.blocks
        self.num_free = 0

    def get_num_free_blocks(self) -> int:
        return self.num_free


class KVView:
    """vLLM's KVCacheManager (one full-attention group) with engine.core's block event log: `events` is the
    log TraceRecorder reads (it installs its own, None below the full trace level); `step_events` gathers
    what vLLM did since its last step was taken, until that step's rows are written."""

    __slots__ = ("manager", "block_pool", "events", "step_events", "req_to_blocks", "num_cached")

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.block_pool = PoolView(manager.block_pool)
        self.events: list[BlockEvent] | None = []
        self.step_events: list[BlockEvent] = []
        single = manager.coordinator.single_type_managers[0]
        # vLLM's own dicts (request id -> blocks held, -> how many of them are cached), live.
        self.req_to_blocks: dict[str, list[Any]] = single.req_to_blocks
        self.num_cached: dict[str, int] = single.num_cached_block

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]


class StepCounts:
    """The scheduler as `TraceRecorder.on_step` reads it (only the queues' lengths and the free blocks),
    holding the values of the step being written rather than vLLM's live ones: rows are built later."""

    __slots__ = ("kv_cache_manager", "running", "waiting")

    def __init__(self, kv: KVView) -> None:
        self.kv_cache_manager = kv
        self.set(0, 0, 0)

    def set(self, num_running: int, num_waiting: int, num_free_blocks: int) -> None:
        # A range is a sized stand-in for a queue of that length that allocates nothing per request.
        self.running, self.waiting = range(num_running), range(num_waiting)
        self.kv_cache_manager.block_pool.num_free = num_free_blocks


def core_output(so: Any, requests: dict[str, Any], preempted: list[tuple[str, list[int]]],
                resumed_as_new: Set[str] = frozenset()) -> SchedulerOutput:
    """vLLM's SchedulerOutput as engine.core's, read right after vLLM's `schedule()` returned.

    Called after vLLM advanced `num_computed_tokens`: a running request's step is a decode when it
    computes one token, that token is an output token, and it is the last token known (vLLM's
    `is_prefill_chunk` is false), which is engine.core's rule. vLLM's v2 model runner sends resumed
    requests as new ones (`resumed_as_new`); they are listed after the running ones, as engine.core does.
    """
    num = so.num_scheduled_tokens
    new = [NewRequestData(d.req_id, [], _UNREAD_PARAMS, list(d.block_ids[0]) if d.block_ids else [],
                          d.num_computed_tokens)
           for d in so.scheduled_new_reqs if d.req_id not in resumed_as_new]
    c = so.scheduled_cached_reqs
    resumed = c.resumed_req_ids
    n = len(c.req_ids)
    # Resumptions are rare: most steps skip the per-request membership tests below.
    cached = CachedRequestData(
        list(c.req_ids), [rid in resumed for rid in c.req_ids] if resumed else [False] * n, [None] * n,
        [list(ids[0]) if ids else [] for ids in c.new_block_ids], list(c.num_computed_tokens))
    for d in so.scheduled_new_reqs if resumed_as_new else ():
        if d.req_id in resumed_as_new:
            cached.req_ids.append(d.req_id)
            cached.resumed_from_preemption.append(True)
            cached.resumed_token_ids.append(None)
            cached.new_block_ids.append(list(d.block_ids[0]) if d.block_ids else [])
            cached.num_computed_tokens.append(d.num_computed_tokens)
    decode = set()
    for rid in c.req_ids:
        if num[rid] == 1 and rid not in resumed:
            r = requests[rid]
            if r.num_computed_tokens - 1 >= r.num_prompt_tokens and not r.is_prefill_chunk:
                decode.add(rid)
    hits = sum(d.num_computed_tokens for d in so.scheduled_new_reqs)
    if resumed:
        hits += sum(k for rid, k in zip(c.req_ids, c.num_computed_tokens) if rid in resumed)
    num_decode = len(decode)
    total = so.total_num_scheduled_tokens
    return SchedulerOutput(new, cached, dict(num), total, set(so.finished_req_ids),
                           [rid for rid, _ in preempted], dict(preempted), total - num_decode, num_decode, hits,
                           decode)
