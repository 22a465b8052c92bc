"""The Scheduler's second half, after the model ran: sampled tokens appended, stop rules applied,
finished requests freed and reported (vLLM 0.32's `update_from_output`), and requests ended from
outside. A mixin of `engine.core.scheduler.Scheduler`, whose state it reads and writes."""
from __future__ import annotations

from collections.abc import Iterable

from engine.core.outputs import EngineCoreOutput, EngineCoreOutputs, ModelRunnerOutput
from engine.core.request import Request, RequestStatus, append_output_tokens, check_stop
from engine.core.sched_output import SchedulerOutput


class SchedulerUpdate:
    """update_from_output and finish_requests; the attributes below are the Scheduler's."""

    requests: dict[str, Request]
    running: list[Request]
    finished_req_ids: set[str]
    max_model_len: int
    has_placeholders: bool

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
        sampled = model_runner_output.sampled_token_ids
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
        return EngineCoreOutputs(outputs, self.make_stats())

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
