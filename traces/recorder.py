"""Turns what the shared scheduler did each step into trace rows; the engine and the simulator both
call it, which is what makes their traces comparable row for row.

Rows are kept as columns (one list per column, extended per step) and handed to the writer as such:
a simulated step costs microseconds, and a dict per decision row was a large share of them."""
from __future__ import annotations

from typing import Any, Protocol

from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.scheduler import Scheduler
from traces.decode_rows import NO_ADMISSION_STOP, DecodeRunRows
from traces.schema import BLOCK_EVENT_COLUMNS, DECISION_COLUMNS, OPTIONAL_COLUMNS, STEP_COLUMNS, TABLES
from traces.runs import GridSpec, RunSpec

# full: every table; steps: steps and requests (no decisions, block events or snapshots); none:
# requests only (per-request metrics, for sweeps).
TRACE_LEVELS = ("full", "steps", "none")
_NO_BLOCKS: tuple[int, ...] = ()
_STEP_ROW = STEP_COLUMNS + OPTIONAL_COLUMNS["steps"]  # a steps row tuple's fields
def _t(value: float | None, t0: float) -> float | None:
    return None if value is None else value - t0


def _set_on_last_row(cols: dict[str, list[Any]], values: dict[str, Any]) -> None:
    """Optional columns are sparse: pad one with nulls up to the table's last row, then set that row."""
    last = len(cols["step"]) - 1
    for c, v in values.items():
        col = cols[c]
        if len(col) < last:
            col.extend([None] * (last - len(col)))
        col.append(v)


class TraceSink(Protocol):
    """Where a recorder's rows go (a `TraceWriter`, or a wrapper such as a cluster replica's). A `columnar`
    sink also lends the recorder its column buffers (`buffer`, `row_buffer`, `run_buffer`: no dict per row);
    the others get each step's rows through `write_rows`."""

    columnar: bool

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def update_meta(self, **fields: Any) -> None: ...

    def flush(self) -> None: ...

    def close(self, compact: bool = True, **final_meta: Any) -> None: ...

    def buffer(self, table: str) -> dict[str, list[Any]]: ...

    def row_buffer(self, table: str) -> list[tuple]: ...

    def run_buffer(self, table: str, spec: RunSpec | GridSpec) -> list[tuple] | None: ...


class TraceRecorder(DecodeRunRows):
    """Call `on_add` for every request, `on_step` after every step, `on_abort` for aborts, `close` at the end."""

    def __init__(self, writer: TraceSink, scheduler: Scheduler, t0: float = 0.0,
                 snapshot_every: int = 1024, trace_level: str = "full") -> None:
        self.writer = writer
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        # Read for every steps row: the pool's size is fixed (engine.core's pool or a view of vLLM's).
        self._num_usable_blocks = self.kv.block_pool.num_usable_blocks
        self._num_free_blocks = self.kv.block_pool.get_num_free_blocks
        self.t0 = t0
        self.snapshot_every = snapshot_every
        self.step = 0
        self.live: dict[str, Request] = {}
        # Columns go straight into a columnar writer's buffers; another gets this step's columns as rows
        # after each step.
        self._direct = writer.columnar
        names = ("decisions", "block_events")
        self._tables = ({t: writer.buffer(t) for t in names} if self._direct
                        else {t: {c: [] for c in TABLES[t] + OPTIONAL_COLUMNS.get(t, ())} for t in names})
        self._decisions = self._tables["decisions"]
        # A steps row is one tuple (STEP_COLUMNS, then the admission columns): a row per simulated step.
        self._step_rows: list[tuple] = writer.row_buffer("steps") if self._direct else []
        self._event_cols = [self._tables["block_events"][c] for c in BLOCK_EVENT_COLUMNS]
        self._pending_decisions: list[tuple] = []
        self._pending_requests: list[dict[str, Any]] = []
        self._init_decode_rows(writer.run_buffer if self._direct else None)
        self.set_trace_level(trace_level)

    def set_trace_level(self, level: str) -> None:
        """`full`, `steps` or `none` (TRACE_LEVELS); below full the block pool stops logging events too."""
        if level not in TRACE_LEVELS:
            raise ValueError(f"--trace-level: must be one of {', '.join(TRACE_LEVELS)}, got {level!r}")
        self.trace_level = level
        self._full = level == "full"
        self._steps = level != "none"
        self.kv.events = [] if self._full else None
        self.writer.update_meta(trace_level=level)

    def on_add(self, request: Request) -> None:
        """After scheduler.add_request: remember it; a rejected one is recorded at the next step."""
        if request.is_finished():
            if self._full:
                self._pending_decisions.append((request.request_id, "reject", None, "error"))
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
            if self._full:
                self._pending_decisions.append((rid, event, blocks, reason))
            if req is not None:
                self._pending_requests.append(self._request_row(req))
                ended.append(req)
        return ended

    def on_step(self, so: SchedulerOutput, outputs: EngineCoreOutputs, start: float, end: float,
                schedule_time: float = 0.0, execute_time: float = 0.0, sample_time: float = 0.0) -> list[Request]:
        """Record the step; returns the requests that finished in it."""
        step = self.step
        finished: list[Request] = []
        requests = self._pending_requests
        full = self._full
        if full:
            self._schedule_decisions(so, step)
        num_finished = 0
        for out in outputs.outputs:
            reason = out.finish_reason
            if reason is None or reason == "error":
                continue
            num_finished += 1
            if full:
                self._decision(step, out.request_id, "finish", out.freed_block_ids, reason)
            req = self.live.pop(out.request_id, None)
            if req is not None:
                requests.append(self._request_row(req))
                finished.append(req)
        writer = self.writer
        if requests:
            writer.write_rows("requests", requests)
            self._pending_requests = []
        if full:
            if self.kv.events:
                self._block_events(step)
            if step % self.snapshot_every == 0:
                writer.write_rows("block_snapshots", self.block_snapshot(step))
        if self._steps:
            sched, t0 = self.scheduler, self.t0
            num_usable = self._num_usable_blocks
            stop = so.admission_stop  # OPTIONAL_COLUMNS["steps"]: why the waiting queue stopped being admitted
            rid, reason, needed, available = NO_ADMISSION_STOP if stop is None else stop
            self._step_rows.append((
                step, start - t0, end - t0, so.num_prefill_tokens, so.num_decode_tokens,
                so.total_num_scheduled_tokens, len(sched.running), len(sched.waiting), len(so.preempted_req_ids),
                num_usable - self._num_free_blocks(), num_usable, so.prefix_hit_tokens,
                len(so.scheduled_new_reqs), num_finished, schedule_time, execute_time, sample_time,
                reason, rid, needed, available))
        if not self._direct:
            self._rows_to_writer()
        writer.flush()
        self.step += 1
        return finished

    def _schedule_decisions(self, so: SchedulerOutput, step: int) -> None:
        """Pending (between-step) rows, then one schedule row per scheduled request, then preemptions."""
        if self._pending_decisions:
            for rid, event, freed, reason in self._pending_decisions:
                self._decision(step, rid, event, freed, reason)
            self._pending_decisions.clear()
        d = self._decisions
        num_tokens = so.num_scheduled_tokens
        for new in so.scheduled_new_reqs:
            computed = new.num_computed_tokens
            for col, value in zip(DECISION_COLUMNS, (step, new.req_id, "schedule", num_tokens[new.req_id], "prefill",
                                                     computed, computed, new.block_ids, _NO_BLOCKS, None)):
                d[col].append(value)
        if so.scheduled_cached_reqs.req_ids:
            self._cached_decisions(so, step)
        for rid in so.preempted_req_ids:
            self._decision(step, rid, "preempt", so.preempted_block_ids[rid], None)
            if so.preempted_for and rid in so.preempted_for:  # whom the preemption served
                forced_by, needed, free = so.preempted_for[rid]
                _set_on_last_row(d, {"preempted_for": forced_by, "blocks_needed": needed, "blocks_free": free})

    def _cached_decisions(self, so: SchedulerOutput, step: int) -> None:
        """The schedule rows of running and resumed requests, in the output's order."""
        d = self._decisions
        cached = so.scheduled_cached_reqs
        rids, computed = cached.req_ids, cached.num_computed_tokens
        n = len(rids)
        decodes = so.decode_req_ids
        if len(decodes) == n and so.num_decode_tokens == n:
            # The common step: every running request decodes exactly one token (none was resumed).
            self._decode_rows(step, rids, computed, cached.new_block_ids)
            return
        num_tokens = so.num_scheduled_tokens
        d["step"].extend([step] * n)
        d["request_id"].extend(rids)
        d["event"].extend(["schedule"] * n)
        d["num_tokens"].extend([num_tokens[r] for r in rids])
        d["phase"].extend(["decode" if r in decodes else "prefill" for r in rids])
        d["num_computed_tokens"].extend(computed)
        d["prefix_hit_tokens"].extend([c if r else 0 for c, r in zip(computed, cached.resumed_from_preemption)])
        d["blocks_gained"].extend(cached.new_block_ids)
        d["blocks_freed"].extend([_NO_BLOCKS] * n)
        d["finish_reason"].extend([None] * n)

    def is_between_steps(self) -> bool:
        """Nothing recorded between steps waits for the next step's rows (rejections, aborts)."""
        return not (self._pending_decisions or self._pending_requests)

    def _decision(self, step: int, rid: str, event: str, freed: list[int] | None, reason: str | None) -> None:
        """A row that schedules nothing: preempt, finish, abort or reject."""
        d = self._decisions
        for col, value in zip(DECISION_COLUMNS, (step, rid, event, 0, None, None, 0, _NO_BLOCKS,
                                                 freed or _NO_BLOCKS, reason)):
            d[col].append(value)

    def _rows_to_writer(self) -> None:
        """For a writer that takes only rows: this step's columns as rows, decisions and events first."""
        for table in ("decisions", "block_events"):
            cols = self._tables[table]
            if cols["step"]:
                for values in cols.values():  # sparse optional columns end short
                    values.extend([None] * (len(cols["step"]) - len(values)))
                self.writer.write_rows(table, [dict(zip(cols, row)) for row in zip(*cols.values())])
                for values in cols.values():
                    values.clear()
        if self._step_rows:
            self.writer.write_rows("steps", [dict(zip(_STEP_ROW, row)) for row in self._step_rows])
            self._step_rows.clear()

    def _block_events(self, step: int) -> None:
        events = self.kv.events
        if events:
            n = len(events)
            step_col, seq, kind, rid, ids, hashes = self._event_cols
            step_col.extend([step] * n)
            seq.extend(range(n))
            for col, values in zip((kind, rid, ids, hashes), zip(*events)):
                col.extend(values)
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
        last = max(self.step - 1, 0)
        if self._full:
            for rid, event, freed, reason in self._pending_decisions:
                self._decision(self.step - 1, rid, event, freed, reason)
            self._pending_decisions.clear()
            self._block_events(last)
            if not self._direct:
                self._rows_to_writer()
        self.writer.close(num_steps=self.step, **final_meta)

    def _request_row(self, r: Request) -> dict[str, Any]:
        t0 = self.t0
        return {"request_id": r.request_id, "arrival": r.arrival_time - t0, "queued": _t(r.queued_time, t0),
                "first_scheduled": _t(r.first_scheduled_time, t0), "first_token": _t(r.first_token_time, t0),
                "finish": _t(r.finished_time, t0), "num_prompt_tokens": r.num_prompt_tokens,
                "num_output_tokens": r.num_output_tokens, "num_cached_tokens": max(r.num_cached_tokens, 0),
                "num_preemptions": r.num_preemptions, "finish_reason": r.get_finish_reason(),
                "priority": r.priority, "max_tokens": r.max_tokens, "error": r.error,
                "prompt_token_ids": r.prompt_token_ids, "output_token_ids": r.output_token_ids}
