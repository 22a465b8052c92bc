"""Turns what the shared scheduler did each step into trace rows; the engine and the simulator both
call it, which is what makes their traces comparable row for row."""
from __future__ import annotations

from typing import Any

from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.scheduler import Scheduler
from traces.writer import TraceWriter


def _t(value: float | None, t0: float) -> float | None:
    return None if value is None else value - t0


def _admission_columns(stop: tuple[str, str, int, int] | None) -> dict[str, Any]:
    """The steps table's OPTIONAL_COLUMNS: why the waiting queue stopped being admitted (null: it emptied)."""
    if stop is None:
        return {"admission_blocked": None, "admission_blocked_request": None,
                "admission_needed": None, "admission_available": None}
    rid, reason, needed, available = stop
    return {"admission_blocked": reason, "admission_blocked_request": rid,
            "admission_needed": needed, "admission_available": available}


class TraceRecorder:
    """Call `on_add` for every request, `on_step` after every step, `on_abort` for aborts, `close` at the end."""

    def __init__(self, writer: TraceWriter, scheduler: Scheduler, t0: float = 0.0,
                 snapshot_every: int = 1024) -> None:
        self.writer = writer
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        self.kv.events = []
        self.t0 = t0
        self.snapshot_every = snapshot_every
        self.step = 0
        self.live: dict[str, Request] = {}
        self._pending_decisions: list[dict[str, Any]] = []
        self._pending_requests: list[dict[str, Any]] = []

    def on_add(self, request: Request) -> None:
        """After scheduler.add_request: remember it; a rejected one is recorded at the next step."""
        if request.is_finished():
            self._pending_decisions.append(self._decision(request.request_id, "reject", finish_reason="error"))
            self._pending_requests.append(self._request_row(request))
        else:
            self.live[request.request_id] = request

    def on_abort(self, freed: dict[str, list[int]]) -> list[Request]:
        """Requests ended from outside between steps; returns those it was following."""
        ended = []
        for rid, blocks in freed.items():
            req = self.live.pop(rid, None)
            reason = req.get_finish_reason() if req else "abort"
            event = "abort" if reason == "abort" else "finish"
            self._pending_decisions.append(self._decision(rid, event, blocks_freed=blocks, finish_reason=reason))
            if req is not None:
                self._pending_requests.append(self._request_row(req))
                ended.append(req)
        return ended

    def on_step(self, so: SchedulerOutput, outputs: EngineCoreOutputs, start: float, end: float,
                schedule_time: float = 0.0, execute_time: float = 0.0, sample_time: float = 0.0) -> list[Request]:
        """Record the step; returns the requests that finished in it."""
        step = self.step
        finished: list[Request] = []
        decisions, self._pending_decisions = self._pending_decisions, []
        requests, self._pending_requests = self._pending_requests, []
        for d in decisions:
            d["step"] = step
        num_tokens = so.num_scheduled_tokens
        for new in so.scheduled_new_reqs:
            decisions.append(self._decision(
                new.req_id, "schedule", step, num_tokens[new.req_id], "prefill", new.num_computed_tokens,
                new.num_computed_tokens, new.block_ids))
        cached = so.scheduled_cached_reqs
        decodes = so.decode_req_ids
        decisions.extend(
            {"step": step, "request_id": rid, "event": "schedule", "num_tokens": num_tokens[rid],
             "phase": "decode" if rid in decodes else "prefill", "num_computed_tokens": computed,
             "prefix_hit_tokens": computed if resumed else 0, "blocks_gained": gained, "blocks_freed": [],
             "finish_reason": None}
            for rid, resumed, computed, gained in zip(cached.req_ids, cached.resumed_from_preemption,
                                                      cached.num_computed_tokens, cached.new_block_ids))
        for rid in so.preempted_req_ids:
            decisions.append(self._decision(rid, "preempt", step, blocks_freed=so.preempted_block_ids[rid]))
            # Whom the preemption served (OPTIONAL_COLUMNS); self-contained so it ports to any row path.
            if so.preempted_for and rid in so.preempted_for:
                forced_by, needed, free = so.preempted_for[rid]
                decisions[-1].update(preempted_for=forced_by, blocks_needed=needed, blocks_free=free)
        num_finished = 0
        for out in outputs.outputs:
            if out.finish_reason is None or out.finish_reason == "error":
                continue
            num_finished += 1
            decisions.append(self._decision(out.request_id, "finish", step, blocks_freed=out.freed_block_ids,
                                            finish_reason=out.finish_reason))
            req = self.live.pop(out.request_id, None)
            if req is not None:
                requests.append(self._request_row(req))
                finished.append(req)
        sched, pool = self.scheduler, self.kv.block_pool
        self.writer.write_rows("decisions", decisions)
        self.writer.write_rows("requests", requests)
        self._write_block_events(step)
        if step % self.snapshot_every == 0:
            self.writer.write_rows("block_snapshots", self.block_snapshot(step))
        self.writer.write_rows("steps", [{
            "step": step, "start": start - self.t0, "end": end - self.t0,
            "num_prefill_tokens": so.num_prefill_tokens, "num_decode_tokens": so.num_decode_tokens,
            "num_scheduled_tokens": so.total_num_scheduled_tokens, "num_running": len(sched.running),
            "num_waiting": len(sched.waiting), "num_preempted": len(so.preempted_req_ids),
            "kv_blocks_used": pool.num_usable_blocks - pool.get_num_free_blocks(),
            "kv_blocks_total": pool.num_usable_blocks, "prefix_hit_tokens": so.prefix_hit_tokens,
            "num_new_reqs": len(so.scheduled_new_reqs), "num_finished": num_finished,
            "schedule_time": schedule_time, "execute_time": execute_time, "sample_time": sample_time,
            **_admission_columns(so.admission_stop)}])
        self.writer.flush()
        self.step += 1
        return finished

    def _write_block_events(self, step: int) -> None:
        events = self.kv.events
        if events:
            self.writer.write_rows("block_events", [
                {"step": step, "seq": i, "kind": k, "request_id": rid, "block_ids": ids, "hashes": hashes}
                for i, (k, rid, ids, hashes) in enumerate(events)])
            events.clear()

    def block_snapshot(self, step: int) -> list[dict[str, Any]]:
        """Every block that is held or cached after `step` (absent blocks are plain free)."""
        holders: dict[int, list[str]] = {}
        for rid, blocks in self.kv.req_to_blocks.items():
            for b in blocks:
                holders.setdefault(b.block_id, []).append(rid)
        rows = []
        for b in self.kv.block_pool.blocks[1:]:
            h = holders.get(b.block_id)
            if h or b.block_hash is not None:
                rows.append({"step": step, "block_id": b.block_id, "holders": sorted(h or []),
                             "cached": b.block_hash is not None,
                             "hash": b.block_hash.hex() if b.block_hash is not None else None})
        return rows

    def close(self, **final_meta: Any) -> None:
        """Write what is pending (aborts after the last step, requests still unfinished) and compact."""
        rows = list(self._pending_requests)
        for req in self.live.values():
            rows.append(self._request_row(req))
        self.writer.write_rows("requests", rows)
        if self._pending_decisions:
            for d in self._pending_decisions:
                d["step"] = self.step - 1
            self.writer.write_rows("decisions", self._pending_decisions)
        self._write_block_events(max(self.step - 1, 0))
        self.writer.close(num_steps=self.step, **final_meta)

    @staticmethod
    def _decision(rid: str, event: str, step: int = -1, num_tokens: int = 0, phase: str | None = None,
                  computed: int | None = None, hits: int = 0, blocks_gained: list[int] | None = None,
                  blocks_freed: list[int] | None = None, finish_reason: str | None = None) -> dict[str, Any]:
        return {"step": step, "request_id": rid, "event": event, "num_tokens": num_tokens, "phase": phase,
                "num_computed_tokens": computed, "prefix_hit_tokens": hits, "blocks_gained": blocks_gained or [],
                "blocks_freed": blocks_freed or [], "finish_reason": finish_reason}

    def _request_row(self, r: Request) -> dict[str, Any]:
        t0 = self.t0
        return {"request_id": r.request_id, "arrival": r.arrival_time - t0, "queued": _t(r.queued_time, t0),
                "first_scheduled": _t(r.first_scheduled_time, t0), "first_token": _t(r.first_token_time, t0),
                "finish": _t(r.finished_time, t0), "num_prompt_tokens": r.num_prompt_tokens,
                "num_output_tokens": r.num_output_tokens, "num_cached_tokens": max(r.num_cached_tokens, 0),
                "num_preemptions": r.num_preemptions, "finish_reason": r.get_finish_reason(),
                "priority": r.priority, "max_tokens": r.max_tokens, "error": r.error,
                "prompt_token_ids": r.prompt_token_ids, "output_token_ids": r.output_token_ids}
