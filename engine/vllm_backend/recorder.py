"""Turns what vLLM's own scheduler did into stepscope trace rows, through `traces.recorder.TraceRecorder`.

The scheduler subclasses (`scheduler.py`) call `on_add`, `on_schedule`, `on_execute_end`,
`on_update` and `on_abort`; block events come from wrapping the KV cache manager's `allocate_slots`,
`cache_blocks` and `free` on the instance, so they are recorded in the order vLLM made them. Steps are
matched to their outputs in schedule order (FIFO), which is both the synchronous order and the
engine core's batch-queue order under async scheduling.

vLLM's step is the hot path, so a step only copies what would change under it (the scheduled block
ids, which vLLM's model runner extends in place; queue lengths; the step's block events) into a
pending list, and looks at a request's outputs only until its first token: the output tokens are read
from vLLM's own Request when it ends. Rows are built and written as Arrow record batches every
`flush_interval` seconds and whenever vLLM runs out of unfinished requests (the idle moment before it
waits), so a killed server loses at most that interval; built every step, rows cost a CPU step too much.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.kv_cache_manager import BlockEvent
from engine.core.outputs import EngineCoreOutput, EngineCoreOutputs
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepTimes
from engine.vllm_backend.views import KVView, RecordedRequest, StepCounts, core_output
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter

# Seconds between writes of the pending rows while vLLM is busy.
FLUSH_INTERVAL_S = 0.5
# A block snapshot every this many steps, as the engine's trace has (taken at the step, not at the write).
SNAPSHOT_EVERY = 1024
_NEVER = 1 << 62


@dataclass(slots=True)
class _ScheduledStep:
    """A step vLLM scheduled and has not updated from yet: its output as engine.core's, and its times."""

    so: SchedulerOutput
    start: float
    schedule_end: float
    execute_end: float  # the schedule's end until vLLM asks for the grammar bitmask


class VllmStepRecorder:
    """One per vLLM scheduler; `t0` is time zero of the trace on `time.monotonic()`."""

    def __init__(self, scheduler: Any, trace_dir: str, meta: dict[str, Any], t0: float | None = None,
                 flush_interval: float = FLUSH_INTERVAL_S, overwrite: bool = False) -> None:
        self.scheduler = scheduler
        self.kv = KVView(scheduler.kv_cache_manager)
        self.t0 = time.monotonic() if t0 is None else t0
        # vLLM stamps arrivals with time.time(); the trace's clock is monotonic.
        self.wall_minus_mono = time.time() - time.monotonic()
        meta = {**meta, "clock_origin_unix_ns": int((self.t0 + self.wall_minus_mono) * 1e9)}
        # The writer and the recorder never write on their own: `flush` decides when.
        self.writer = TraceWriter(trace_dir, meta, flush_every=_NEVER, stream_format="arrow", overwrite=overwrite)
        self.counts = StepCounts(self.kv)
        self.recorder = TraceRecorder[RecordedRequest](self.writer, self.counts, self.t0, snapshot_every=_NEVER)
        self.requests: dict[str, RecordedRequest] = {}
        # Those with no output token yet: the only ones whose outputs a step has to look at.
        self.awaiting_first: dict[str, RecordedRequest] = {}
        self.in_flight: deque[_ScheduledStep] = deque()
        self._freed: list[tuple[str, list[int]]] = []
        # (recorder method, arguments) in the order vLLM made the calls, written by `flush`.
        self.pending: list[tuple[Callable[..., Any], tuple]] = []
        self.num_steps = 0
        self.flush_interval = flush_interval
        self._last_flush = time.monotonic()
        self._wrap_kv_manager(scheduler.kv_cache_manager)

    def set_t0(self, t0: float) -> None:
        """Move time zero (before the first request): `engine run` counts from its own start."""
        self.t0 = self.recorder.t0 = t0
        self.writer.update_meta(clock_origin_unix_ns=int((t0 + self.wall_minus_mono) * 1e9))

    # ---- block events, in the order vLLM's KV cache manager makes them -----------------------------
    def _wrap_kv_manager(self, manager: Any) -> None:
        # These run for every scheduled request of every step: the manager's dicts are bound once (vLLM
        # creates them with the manager and never replaces them) rather than looked up through the view.
        kv = self.kv
        allocate, cache, free = manager.allocate_slots, manager.cache_blocks, manager.free
        req_to_blocks, num_cached = kv.req_to_blocks, kv.num_cached

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            rid = request.request_id
            blocks = req_to_blocks.get(rid)
            held = len(blocks) if blocks else 0
            cached = num_cached.get(rid, 0)
            out = allocate(request, *args, **kwargs)
            if out is not None:
                blocks = req_to_blocks.get(rid)
                # Only the tail: a decode step must not cost O(blocks held).
                if blocks is not None and len(blocks) > held:
                    ids = [b.block_id for b in blocks[held:]]
                    computed = args[2] if len(args) > 2 else kwargs.get("new_computed_blocks")
                    num_hit = len(computed.blocks[0]) if computed is not None and computed.blocks else 0
                    if num_hit:
                        kv.step_events.append(("hit", rid, ids[:num_hit], None))
                    if len(ids) > num_hit:
                        kv.step_events.append(("new", rid, ids[num_hit:], None))
                    cached = max(cached, held + num_hit)
                if num_cached.get(rid, 0) > cached:
                    self._cached_since(rid, cached)
            return out

        def cache_blocks(request: Any, num_computed_tokens: int) -> None:
            rid = request.request_id
            before = num_cached.get(rid, 0)
            cache(request, num_computed_tokens)
            self._cached_since(rid, before)

        def free_blocks(request: Any) -> None:
            ids = kv.block_ids(request.request_id)
            free(request)
            if ids:
                kv.step_events.append(("free", request.request_id, ids, None))
            self._freed.append((request.request_id, ids))

        manager.allocate_slots, manager.cache_blocks, manager.free = allocate_slots, cache_blocks, free_blocks

    def _cached_since(self, rid: str, before: int) -> None:
        after = self.kv.num_cached.get(rid, 0)
        if after > before:
            blocks = self.kv.req_to_blocks[rid][before:after]
            self.kv.step_events.append(("cache", rid, [b.block_id for b in blocks],
                                   [b.block_hash.hex() for b in blocks]))

    def take_freed(self) -> list[tuple[str, list[int]]]:
        freed, self._freed = self._freed, []
        return freed

    # ---- the scheduler's calls -----------------------------------------------------------------------
    def on_add(self, request: Any) -> None:
        now = time.monotonic()
        rec = RecordedRequest(request.request_id, request.arrival_time - self.wall_minus_mono, now,
                              request.num_prompt_tokens, list(request.prompt_token_ids or ()), request.max_tokens,
                              request.priority, source=request)
        self.requests[rec.request_id] = self.awaiting_first[rec.request_id] = rec
        self.recorder.on_add(rec)  # now, while the request is unfinished: it only joins the live ones

    def on_reject(self, request_id: str, prompt_token_ids: list[int], arrival_time: float, reason: str,
                  num_prompt_tokens: int | None = None) -> None:
        """A request vLLM's input processor refused (it never reached the scheduler) still belongs in the
        trace, as an error with vLLM's reason; `arrival_time` is on time.monotonic(). `num_prompt_tokens`
        stands for ids never made (a prompt refused for its length)."""
        now = time.monotonic()
        n = len(prompt_token_ids) if num_prompt_tokens is None else num_prompt_tokens
        rec = RecordedRequest(request_id, arrival_time, now, n, list(prompt_token_ids), None,
                              finished_time=now, finish_reason="error", error=reason)
        self.recorder.on_add(rec)

    def on_schedule(self, so: Any, start: float, end: float) -> None:
        preempted = self.take_freed()
        recs = self.requests
        for rid, _ in preempted:
            if (r := recs.get(rid)) is not None:
                r.num_preemptions += 1
        resumed_as_new = set()
        for d in so.scheduled_new_reqs:
            r = recs.get(d.req_id)
            if r is None:
                continue
            if r.first_scheduled_time is None:
                r.first_scheduled_time = start
                r.num_cached_tokens = d.num_computed_tokens
            else:
                resumed_as_new.add(d.req_id)
        self.in_flight.append(
            _ScheduledStep(core_output(so, self.scheduler.requests, preempted, resumed_as_new), start, end, end))

    def on_execute_end(self, when: float) -> None:
        """vLLM asks for the grammar bitmask between the forward pass and sampling."""
        if self.in_flight:
            self.in_flight[-1].execute_end = when

    def on_update(self, outputs: dict[int, Any], update_start: float, end: float) -> None:
        freed = dict(self.take_freed())
        scheduled = self.in_flight.popleft()
        so, start, sched_end, exec_end = scheduled.so, scheduled.start, scheduled.schedule_end, scheduled.execute_end
        awaiting = self.awaiting_first
        finished: list[tuple[str, str]] = []
        any_output = False
        for eco in outputs.values():
            for o in eco.outputs:
                any_output = True
                if o.request_id in awaiting and o.new_token_ids:
                    awaiting.pop(o.request_id).first_token_time = end
                if o.finish_reason is not None:
                    reason = str(o.finish_reason)
                    finished.append((o.request_id, reason))
                    self._ended(o.request_id, reason, end)
        kv = self.kv
        if not (so.total_num_scheduled_tokens or so.preempted_req_ids or any_output or kv.step_events):
            # vLLM's empty step that only tells the workers which requests finished: no decision.
            if self.pending and not self.scheduler.has_unfinished_requests():
                self.flush()  # aborts pending from between steps
            return
        sched = self.scheduler
        step = self.num_steps
        self.num_steps += 1
        snapshot = self.recorder.block_snapshot(step) if step % SNAPSHOT_EVERY == 0 else None
        events, kv.step_events = kv.step_events, []
        self.pending.append((self._write_step, (
            step, so, finished, freed, (start, sched_end, exec_end, update_start, end),
            len(sched.running), len(sched.waiting), kv.block_pool.pool.get_num_free_blocks(), events, snapshot)))
        # Out of unfinished requests is vLLM's idle moment: has_requests() stays true one step longer, for
        # the empty step that reports the finished ones, which an in-process LLMEngine only runs once
        # new requests arrive. Only a step that finished some can be the last (aborts end in that
        # empty step, above), so the others skip the question.
        if end - self._last_flush >= self.flush_interval or (finished and not sched.has_unfinished_requests()):
            self.flush()

    def _ended(self, request_id: str, reason: str, when: float) -> None:
        if (r := self.requests.pop(request_id, None)) is not None:
            self.awaiting_first.pop(request_id, None)
            r.finish_reason, r.finished_time = reason, when
            r.take_outputs()

    def _write_step(self, step: int, so: SchedulerOutput, finished: list[tuple[str, str]], freed: dict[str, list[int]],
                    times: StepTimes, num_running: int, num_waiting: int, num_free: int, events: list[BlockEvent],
                    snapshot: list[dict] | None) -> None:
        """One pending step through the recorder, with the counts and block events as they were then."""
        self.counts.set(num_running, num_waiting, num_free)
        log = self.kv.events
        if log is not None:
            log.extend(events)
        core = EngineCoreOutputs([EngineCoreOutput(rid, [], reason, freed_block_ids=freed.get(rid))
                                  for rid, reason in finished])
        self.recorder.on_step(step, so, core, times)
        if snapshot:
            self.writer.write_rows("block_snapshots", snapshot)

    def flush(self) -> None:
        """Build the pending rows and hand them to the OS."""
        pending, self.pending = self.pending, []
        for fn, args in pending:
            fn(*args)
        self.writer.drain()
        self._last_flush = time.monotonic()

    def on_abort(self, reason_of: Callable[[str], str]) -> None:
        """After vLLM's `finish_requests`: the requests it ended from outside, with the blocks they held."""
        now = time.monotonic()
        freed = dict(self.take_freed())
        for rid in freed:
            self._ended(rid, reason_of(rid), now)
        if freed:
            self.pending.append((self.recorder.on_abort, (freed,)))

    def close(self, **final_meta: Any) -> None:
        self.flush()
        log, kv = self.kv.events, self.kv
        if log is not None:  # blocks freed after the last step: the recorder puts them under that step
            log.extend(kv.step_events)
        kv.step_events = []
        for r in self.requests.values():  # unfinished: their outputs so far
            r.take_outputs()
        self.recorder.close(**final_meta)
