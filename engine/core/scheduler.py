"""vLLM v1's scheduler: one token budget per step, running requests first, then waiting ones.

There are no prefill and decode phases: each request simply has `num_tokens - num_computed_tokens`
tokens left to compute, and a step gives every request as many as the budget allows, so prefill chunks
and decodes share a batch. When a running request cannot get a block, the newest running request (FCFS)
or the lowest-priority, latest-arriving one (priority) is preempted and later recomputed; a step that
preempts admits nobody new.

Every decision follows vLLM 0.32's own Scheduler, checked step for step against it in
tests/test_vllm_conformance.py; rules that changed across versions name vLLM's option where they apply.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.outputs import EngineCoreOutput, EngineCoreOutputs, ModelRunnerOutput, SchedulerStats
from engine.core.request import Request, RequestStatus, admission_error, append_output_tokens, check_stop
from engine.core.request_queue import create_request_queue
from engine.core.sched_output import NO_BLOCK_IDS, CachedRequestData, NewRequestData, SchedulerOutput

class Scheduler:
    """Decides, each step, which requests compute how many tokens; shared verbatim by engine and simulator."""

    has_placeholders = False  # True in AsyncScheduler: sampled tokens settle output placeholders

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if cache_config.num_gpu_blocks is None:
            raise ValueError("cache_config.num_gpu_blocks: must be set before the scheduler is built")
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.token_budget
        self.max_model_len = scheduler_config.max_model_len
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.reserve_full_isl = scheduler_config.scheduler_reserve_full_isl
        self.priority_policy = scheduler_config.policy == "priority"
        self.block_size = cache_config.block_size
        self.kv_cache_manager = KVCacheManager(
            cache_config.num_gpu_blocks, cache_config.block_size, scheduler_config.max_model_len,
            cache_config.enable_prefix_caching, cache_config.watermark)
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self._rejected: list[Request] = []
        self._num_preempted_last_step = 0

    # ---- admission -------------------------------------------------------------------------------
    def add_request(self, request: Request) -> bool:
        """Queue a request, or reject it (FINISHED_ERROR with a reason, reported at the next update)
        when it could never run, so it cannot stall the queue forever."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        request.queued_time = self.clock()
        if request.max_tokens is None:
            request.max_tokens = max(1, self.max_model_len - request.num_prompt_tokens)
        request.num_tokens_limit = min(self.max_model_len, request.num_prompt_tokens + request.max_tokens)
        if self.cache_config.enable_prefix_caching and request.block_size != self.block_size:
            request.block_size = self.block_size
            request.block_hashes = []
            request.update_block_hashes()
        reason = admission_error(request, self.max_model_len, self.block_size,
                                 self.kv_cache_manager.block_pool.num_usable_blocks)
        if reason is not None:
            request.status = RequestStatus.FINISHED_ERROR
            request.error = reason
            request.finished_time = request.queued_time
            self._rejected.append(request)
            return False
        self.waiting.add_request(request)
        self.requests[request.request_id] = request
        return True

    # ---- one step --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Running requests first, in order, then waiting ones; each scheduled request is advanced past its
        tokens at once (the output keeps the counts before), so the next step can follow at once."""
        now = self.clock()
        # Requests finished since the last step are told to the workers once: this output carries them.
        finished, self.finished_req_ids = self.finished_req_ids, set()
        out = SchedulerOutput([], CachedRequestData([], [], [], [], []), {}, 0, finished)
        # vLLM 0.32: the long-prefill cap only applies when another request could use the budget.
        threshold = self.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        budget = self._schedule_running(out, self.max_num_scheduled_tokens, threshold)
        num_running = len(out.scheduled_cached_reqs.req_ids)
        cached = out.scheduled_cached_reqs
        cached.resumed_from_preemption, cached.resumed_token_ids = [False] * num_running, [None] * num_running
        if out.preempted_req_ids:  # a step that preempts admits nobody
            if self.waiting:
                out.admission_stop = (self.waiting.peek_request().request_id, "preempted", 0, 0)
        elif self.waiting:  # with nobody waiting there is nothing to admit and no reason to note
            budget = self._schedule_waiting(out, budget, threshold, now)
        out.total_num_scheduled_tokens = self.max_num_scheduled_tokens - budget
        out.num_decode_tokens = len(out.decode_req_ids)  # a decode is scheduled its one token left
        out.num_prefill_tokens = out.total_num_scheduled_tokens - out.num_decode_tokens
        self._num_preempted_last_step = len(out.preempted_req_ids)
        return out

    def _schedule_decodes(self, out: SchedulerOutput) -> int:
        """`_schedule_running`'s decode case, taken first for the leading decodes (`Request.is_decoding`,
        blocks that do not run short) when the budget covers every running request: nothing can then be
        capped or preempted, so each gets its one token, a block only past its slot limit, as the general
        rule gives it. Returns how many it scheduled; `_schedule_running` goes on from there."""
        kv = self.kv_cache_manager
        slot_limit = kv.slot_limit
        last = self.max_model_len - 1
        cached = out.scheduled_cached_reqs
        run_ids, run_computed, run_block_ids = cached.req_ids, cached.num_computed_tokens, cached.new_block_ids
        for req in self.running:
            computed = req.num_computed_tokens
            if computed >= last or not req.is_decoding():
                break
            rid = req.request_id
            if computed < slot_limit[rid]:
                block_ids = NO_BLOCK_IDS
            else:
                new_blocks = kv.allocate_slots(req, 1)
                if new_blocks is None:
                    break  # short of a block: the general loop retries it and preempts
                block_ids = [b.block_id for b in new_blocks] if new_blocks else NO_BLOCK_IDS
            run_ids.append(rid)
            run_computed.append(computed)
            run_block_ids.append(block_ids)
            req.num_computed_tokens = computed + 1
            req.num_in_flight_tokens += 1
            req.is_prefill_chunk = False
        out.num_scheduled_tokens = dict.fromkeys(run_ids, 1)  # taken first: nothing scheduled before
        out.decode_req_ids.update(run_ids)
        return len(run_ids)

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int) -> int:
        """Give each running request the tokens it has left, as far as the budget goes, preempting from
        the back of the line when a block is short; returns the budget left."""
        running = self.running
        start = 0
        if not self.has_placeholders and len(running) <= budget:
            start = self._schedule_decodes(out)
            budget -= start
            if start == len(running):
                return budget
        kv = self.kv_cache_manager
        max_model_len = self.max_model_len
        long_prefill_cap = threshold if threshold > 0 else max_model_len
        has_placeholders = self.has_placeholders
        slot_limit = kv.slot_limit  # every running request holds blocks, so has an entry
        num_scheduled = out.num_scheduled_tokens
        cached = out.scheduled_cached_reqs
        run_ids, run_computed, run_block_ids = cached.req_ids, cached.num_computed_tokens, cached.new_block_ids
        decode_ids = out.decode_req_ids
        preempted = out.preempted_req_ids
        for req in running[start:]:  # a preemption removes its victim from self.running, not from this copy
            if budget <= 0:
                break
            if preempted and req.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            computed = req.num_computed_tokens
            placeholders = req.num_output_placeholders
            if (placeholders and req.max_tokens is not None
                    and computed + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens):
                continue  # async: the step in flight already reaches max_tokens
            left = req.num_tokens_left
            n = left if left <= long_prefill_cap else long_prefill_cap
            if n > budget:
                n = budget
            end = computed + n
            if end >= max_model_len:  # room for the token this step samples (vLLM 0.32: max_model_len - computed - 1)
                end = max_model_len - 1
                n = end - computed
            if n <= 0:
                continue
            rid = req.request_id
            if end <= slot_limit[rid]:  # the held blocks have room and none fills up: nothing to do
                block_ids = NO_BLOCK_IDS
            else:
                while (new_blocks := kv.allocate_slots(req, n)) is None:
                    victim = self._pick_victim()
                    running.remove(victim)
                    budget += self._preempt_in_step(victim, req, out)
                    if victim is req:
                        break
                if new_blocks is None:
                    break
                if not new_blocks:
                    block_ids = NO_BLOCK_IDS
                elif len(new_blocks) == 1:  # a decode's one new block, without a comprehension's cost
                    block_ids = [new_blocks[0].block_id]
                else:
                    block_ids = [b.block_id for b in new_blocks]
            run_ids.append(rid)
            run_computed.append(computed)
            run_block_ids.append(block_ids)
            num_scheduled[rid] = n
            if left == 1 and req.is_decoding():
                decode_ids.add(rid)
            req.num_computed_tokens = end
            req.num_in_flight_tokens += n
            if end < computed + left:
                req.is_prefill_chunk = True
            else:
                req.is_prefill_chunk = False
                if has_placeholders:
                    req.num_output_placeholders = placeholders + 1
            budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int, now: float) -> int:
        """Admit waiting requests in queue order while the budget, the seats and the blocks allow; the
        first that does not fit stops admission (out.admission_stop says why). Returns the budget left."""
        kv = self.kv_cache_manager
        waiting = self.waiting
        running = self.running
        cached = out.scheduled_cached_reqs
        skipped: list[Request] = []
        while waiting and self.can_admit(budget):
            req = waiting.peek_request()
            if req.num_stale_output_tokens:
                skipped.append(waiting.pop_request())  # async: its pre-preemption output is still due
                continue
            hit_blocks, num_hit = kv.get_computed_blocks(req)
            n = req.num_tokens - num_hit
            if 0 < threshold < n:
                n = threshold
            if not self.enable_chunked_prefill and n > budget:
                out.admission_stop = (req.request_id, "no_chunk", n, budget)
                break
            n = min(n, budget)
            new_blocks = kv.allocate_slots(req, n, num_hit, hit_blocks, full_sequence_must_fit=self.reserve_full_isl,
                                           has_scheduled_reqs=bool(running))
            if new_blocks is None:
                whole, need, free = kv.last_shortfall
                out.admission_stop = (req.request_id, "full_sequence" if whole else "kv_short", need, free)
                break
            waiting.pop_request()
            running.append(req)
            kv.record_prefix_hit(req, num_hit)
            rid = req.request_id
            if req.status == RequestStatus.PREEMPTED:
                cached.req_ids.append(rid)
                cached.resumed_from_preemption.append(True)
                cached.resumed_token_ids.append(list(req.all_token_ids))
                cached.new_block_ids.append(kv.get_block_ids(rid))
                cached.num_computed_tokens.append(num_hit)
            else:
                out.scheduled_new_reqs.append(NewRequestData(rid, req.prompt_token_ids, req.sampling_params,
                                                             kv.get_block_ids(rid), num_hit, req.eos_token_id))
            req.status = RequestStatus.RUNNING
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            out.num_scheduled_tokens[rid] = n
            out.prefix_hit_tokens += num_hit
            budget -= n
            req.num_computed_tokens = num_hit + n
            req.num_in_flight_tokens += n
            req.is_prefill_chunk = num_hit + n < req.num_tokens + req.num_output_placeholders
            if self.has_placeholders and not req.is_prefill_chunk:
                req.num_output_placeholders += 1
        else:
            if waiting:  # the loop's own condition ended it: budget spent or every seat taken
                out.admission_stop = self.closed_admission(budget)
        if skipped:
            waiting.prepend_requests(skipped)
        return budget

    def can_admit(self, budget: int) -> bool:
        """Whether the waiting queue is looked at with `budget` tokens left: a token left and a seat free."""
        return budget > 0 and len(self.running) < self.max_num_running_reqs

    def closed_admission(self, budget: int) -> tuple[str, str, int, int]:
        """The admission stop of a step that left `budget` tokens and did not look at the waiting queue."""
        return (self.waiting.peek_request().request_id, "token_budget" if budget <= 0 else "max_num_seqs", 0, 0)

    def _preempt_in_step(self, victim: Request, for_req: Request, out: SchedulerOutput) -> int:
        """Preempt `victim` so that `for_req` gets its blocks: note why, take back what the victim was
        scheduled earlier in this step, and return those tokens to the budget."""
        vid = victim.request_id
        if out.preempted_for is None:
            out.preempted_for = {}
        out.preempted_for[vid] = (for_req.request_id, *self.kv_cache_manager.last_shortfall[1:])
        n = out.num_scheduled_tokens.pop(vid, 0)
        if n:
            cached = out.scheduled_cached_reqs
            k = cached.req_ids.index(vid)
            del cached.req_ids[k], cached.num_computed_tokens[k], cached.new_block_ids[k]
            out.decode_req_ids.discard(vid)
            victim.num_in_flight_tokens -= n  # undo this step's advance; _preempt resets the rest
        out.preempted_block_ids[vid] = self._preempt(victim)
        out.preempted_req_ids.append(vid)
        return n

    def _pick_victim(self) -> Request:
        if self.priority_policy:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request) -> list[int]:
        """Recompute-style preemption: drop the KV, go back to the waiting queue's front."""
        freed = self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        # Async: the output of steps in flight still arrives and is appended, but it is stale.
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        return freed

    # ---- after the model ran -----------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, apply the stop rules, free finished requests, report per request."""
        now = self.clock()
        outputs: list[EngineCoreOutput] = []
        logprobs = model_runner_output.logprobs
        stopped_running: set[Request] = set()
        stopped_waiting: set[Request] = set()
        requests = self.requests
        max_model_len = self.max_model_len
        has_placeholders = self.has_placeholders
        num_scheduled = scheduler_output.num_scheduled_tokens
        # Walk the requests in the scheduler's own order, not the runner's batch order, so that finishes
        # (and so the free queue) never depend on how a runner arranges its batch. Runners that keep the
        # scheduler's order (the simulator's) skip the reordering.
        sampled: list[list[int]] | list[list[int] | None] = model_runner_output.sampled_token_ids
        if model_runner_output.req_ids != list(num_scheduled):
            by_id = dict(zip(model_runner_output.req_ids, sampled))
            sampled = [by_id.get(req_id) for req_id in num_scheduled]
        for (req_id, num_tokens), new_ids in zip(num_scheduled.items(), sampled):
            try:
                req = requests[req_id]
            except KeyError:
                continue  # finished (or aborted) while this step was in flight
            req.num_in_flight_tokens -= num_tokens
            if req.num_stale_output_tokens:
                req.num_stale_output_tokens -= num_tokens
                stale = True
            else:
                stale = False
            if not new_ids:
                continue
            status_before = req.status
            if req.first_token_time is None:
                req.first_token_time = now
            if len(new_ids) == 1:  # the common case, inline: one token, which most often stops nothing
                tok = new_ids[0]
                req.output_token_ids.append(tok)
                all_ids = req.all_token_ids
                all_ids.append(tok)
                # Its block hashes follow when they are read (KVCacheManager hashes a request's filled
                # blocks before it publishes or looks them up), not here for every token.
                done = ((len(all_ids) >= req.num_tokens_limit or tok in req.stop_token_set)
                        and check_stop(req, max_model_len))
            else:
                new_ids, done = append_output_tokens(req, new_ids, max_model_len)
            if has_placeholders:
                self._settle_placeholders(req, len(new_ids), stale, status_before)
            # num_cached_tokens is set (>= 0) when a request is first admitted, before it can sample.
            out = EngineCoreOutput(req_id, new_ids, None, None, req.num_cached_tokens)
            if logprobs:
                out.new_logprobs = logprobs.get(req_id)
            if done:
                (stopped_running if status_before == RequestStatus.RUNNING else stopped_waiting).add(req)
                out.finish_reason = req.get_finish_reason()
                out.stop_reason = req.stop_reason
                out.freed_block_ids = self._finish(req, now)
            outputs.append(out)
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_waiting:
            self.waiting.remove_requests(stopped_waiting)
        if self._rejected:
            for req in self._rejected:
                outputs.append(EngineCoreOutput(req.request_id, [], finish_reason="error", stop_reason=req.error))
            self._rejected.clear()
        return EngineCoreOutputs(outputs, self.make_stats(), model_runner_output.moe_stats)

    def _settle_placeholders(self, req: Request, num_new: int, stale: bool, status_before: RequestStatus) -> None:
        """Async scheduling only (see AsyncScheduler): sampled tokens replace output placeholders."""

    def _finish(self, req: Request, now: float) -> list[int]:
        req.finished_time = now
        del self.requests[req.request_id]
        self.finished_req_ids.add(req.request_id)
        return self.kv_cache_manager.free(req)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus,
                        stop_reason: int | str | None = None) -> dict[str, list[int]]:
        """End requests from outside (abort, stop string found by the output processor); returns the
        block ids each one gave back."""
        now = self.clock()
        ended = [r for rid in request_ids if (r := self.requests.get(rid)) is not None]
        if not ended:
            return {}
        ended_set = set(ended)
        self.running = [r for r in self.running if r not in ended_set]
        self.waiting.remove_requests(ended_set)
        freed = {}
        for req in ended:
            req.status = status
            if stop_reason is not None:
                req.stop_reason = stop_reason
            freed[req.request_id] = self._finish(req, now)
        return freed

    def decode_only(self) -> bool:
        """Synchronous scheduling, between steps, where the next steps are decode steps alone: every
        running request decodes (`Request.is_decoding`) with nothing in flight, no rejection waits to be
        reported, and the waiting queue is not looked at (no seat or token left once every running
        request has its one). Until a request finishes, `schedule` then gives each its one token and
        admits nobody; `engine.core.decode_run` takes such steps in closed form."""
        running = self.running
        if (not running or self._rejected or self.has_placeholders
                or len(running) > self.max_num_scheduled_tokens):
            return False
        if self.waiting and self.can_admit(self.max_num_scheduled_tokens - len(running)):
            return False
        for req in running:
            if req.num_in_flight_tokens or not req.is_decoding():
                return False
        return True

    # ---- introspection -------------------------------------------------------------------------
    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def has_requests(self) -> bool:
        """vLLM's engine core steps while this holds: unfinished requests, or finishes not yet announced
        to the workers in a scheduler output (one more, possibly empty, step)."""
        return self.has_unfinished_requests() or bool(self.finished_req_ids)

    def has_pending_outputs(self) -> bool:
        """Rejections not yet reported count as work left for the step loop."""
        return bool(self._rejected)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(len(self.running), len(self.waiting), kv.block_pool.get_usage(),
                              self._num_preempted_last_step, kv.make_prefix_cache_stats())
