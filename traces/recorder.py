"""Turns what the shared scheduler did each step into trace rows; the engine and the simulator both
call it, which is what makes their traces comparable row for row.

Rows are kept as columns (one list per column, extended per step) and handed to the writer as such:
a simulated step costs microseconds, and a dict per decision row was a large share of them."""
from __future__ import annotations

from itertools import chain, repeat
from typing import Any

from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.scheduler import Scheduler
from traces.runs import GridSpec, RunSpec
from traces.schema import BLOCK_EVENT_COLUMNS, DECISION_COLUMNS, OPTIONAL_COLUMNS, STEP_COLUMNS, TABLES
from traces.writer import TraceWriter

# full: every table; steps: steps and requests (no decisions, block events or snapshots); none:
# requests only (per-request metrics, for sweeps).
TRACE_LEVELS = ("full", "steps", "none")
_NO_BLOCKS: tuple[int, ...] = ()
_NO_STOP = (None, None, None, None)
_STEP_ROW = STEP_COLUMNS + OPTIONAL_COLUMNS["steps"]  # a steps row tuple's fields
# The common step, every running request decoding one token, as one grid run of decision rows per step or
# per decode run of steps (sim.decode_runs): (position, count, first step, n, request ids, computed counts
# at the first step, {row: new block ids}).
DECODE_RUN = GridSpec(step="step", per_seat="request_id", counting="num_computed_tokens", sparse="blocks_gained",
                      constants={"event": "schedule", "num_tokens": 1, "phase": "decode", "prefix_hit_tokens": 0,
                                 "blocks_freed": _NO_BLOCKS})


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


class TraceRecorder:
    """Call `on_add` for every request, `on_step` after every step, `on_abort` for aborts, `close` at the end."""

    def __init__(self, writer: TraceWriter, scheduler: Scheduler, t0: float = 0.0,
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
        # Columns go straight into the writer's buffers; a writer that takes only rows (a wrapper such as
        # a cluster replica's) gets this step's columns as rows after each step.
        self._direct = hasattr(writer, "buffer")
        names = ("decisions", "block_events")
        self._tables = ({t: writer.buffer(t) for t in names} if self._direct
                        else {t: {c: [] for c in TABLES[t] + OPTIONAL_COLUMNS.get(t, ())} for t in names})
        self._decisions = self._tables["decisions"]
        # A steps row is one tuple (STEP_COLUMNS, then the admission columns): a row per simulated step.
        self._step_rows: list[tuple] = writer.row_buffer("steps") if self._direct else []
        self._event_cols = [self._tables["block_events"][c] for c in BLOCK_EVENT_COLUMNS]
        self._pending_decisions: list[tuple] = []
        # In a decode run, (step, how many of the pool's events it made) per step that made some, and
        # how many events those steps made in all (sim.decode_runs: on_decode_step_blocks).
        self._event_steps: list[tuple[int, int]] = []
        self._events_marked = 0
        self._pending_requests: list[dict[str, Any]] = []
        # The common all-decode step: one run per step where the writer takes runs (a batched writer's
        # Arrow stream), else its rows appended from these lists that do not depend on the step.
        run_buffer = getattr(writer, "run_buffer", None) if self._direct else None
        self._decode_runs = run_buffer("decisions", DECODE_RUN) if run_buffer is not None else None
        # A decode run's steps rows, as one run entry: (position, k, n, n, n, steps, starts, ends, blocks
        # used, the three phases); every other column is the same in each of its steps.
        self._step_runs = run_buffer("steps", RunSpec(
            per_run=("num_decode_tokens", "num_scheduled_tokens", "num_running"),
            per_row=("step", "start", "end", "kv_blocks_used", "schedule_time", "execute_time", "sample_time"),
            constants={"num_prefill_tokens": 0, "num_waiting": 0, "num_preempted": 0, "prefix_hit_tokens": 0,
                       "kv_blocks_total": self._num_usable_blocks, "num_new_reqs": 0, "num_finished": 0},
        )) if run_buffer is not None else None
        self._decode_consts: dict[int, tuple[list, ...]] = {}
        self.set_trace_level(trace_level)

    def set_trace_level(self, level: str) -> None:
        """`full`, `steps` or `none` (TRACE_LEVELS); below full the block pool stops logging events too."""
        if level not in TRACE_LEVELS:
            raise ValueError(f"--trace-level: must be one of {', '.join(TRACE_LEVELS)}, got {level!r}")
        self.trace_level = level
        self._full = level == "full"
        self._steps = level != "none"
        self.kv.events = [] if self._full else None
        if hasattr(self.writer, "update_meta"):
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
            rid, reason, needed, available = _NO_STOP if stop is None else stop
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

    def _decode_rows(self, step: int, rids: list[str], computed: list[int], block_ids: list) -> None:
        """The schedule rows of a step in which every scheduled request decodes one token."""
        d = self._decisions
        n = len(rids)
        if self._decode_runs is not None:
            gained = {i: ids for i, ids in enumerate(block_ids) if ids}
            self._decode_runs.append((len(d["step"]), n, step, n, rids, computed, gained))
            return
        consts = self._decode_consts.get(n)
        if consts is None:
            consts = self._decode_consts[n] = (["schedule"] * n, [1] * n, ["decode"] * n, [0] * n,
                                               [_NO_BLOCKS] * n, [None] * n)
        schedule, ones, phase, zeros, no_blocks, nones = consts
        d["step"].extend([step] * n)
        d["request_id"].extend(rids)
        d["event"].extend(schedule)
        d["num_tokens"].extend(ones)
        d["phase"].extend(phase)
        d["num_computed_tokens"].extend(computed)
        d["prefix_hit_tokens"].extend(zeros)
        d["blocks_gained"].extend(block_ids)
        d["blocks_freed"].extend(no_blocks)
        d["finish_reason"].extend(nones)

    def is_between_steps(self) -> bool:
        """Nothing recorded between steps waits for the next step's rows (rejections, aborts)."""
        return not (self._pending_decisions or self._pending_requests)

    def on_decode_step_blocks(self, step: int) -> None:
        """During a decode run (`sim.decode_runs`), after step `step`'s block crossings: which of the
        pool's events are its own (they become rows with the run's, `_run_block_events`), and the pool's
        snapshot if one is due, taken as `on_step` takes it (the run's rows come later)."""
        if self._full:
            num_events = len(self.kv.events)
            if num_events > self._events_marked:
                self._event_steps.append((step, num_events - self._events_marked))
                self._events_marked = num_events
            if step % self.snapshot_every == 0:
                self.writer.write_rows("block_snapshots", self.block_snapshot(step))

    def _run_block_events(self) -> None:
        """The block events of a decode run's steps, in one pass: a run crosses blocks in most of its
        steps, and a pass per step cost more than the events' own rows."""
        marks = self._event_steps
        step_col, seq, kind, rid, ids, hashes = self._event_cols
        step_col.extend(chain.from_iterable(repeat(step, count) for step, count in marks))
        seq.extend(chain.from_iterable(range(count) for _, count in marks))
        events = self.kv.events  # those after the last mark (a run cut short mid-step) wait for on_step
        for col, values in zip((kind, rid, ids, hashes), zip(*events[:self._events_marked])):
            col.extend(values)
        del events[:self._events_marked]
        marks.clear()
        self._events_marked = 0

    def on_decode_run(self, rids: list[str], computed0: list[int], starts: list[float], ends: list[float],
                      phases: tuple[list[float], list[float], list[float]], used: list[int],
                      gained: dict[int, list[int]]) -> None:
        """Record the steps of a decode run: every request of `rids` decodes one token per step, from
        `computed0` computed tokens; step j ran `starts[j]`..`ends[j]`, its schedule, execute and sample
        times `phases[0][j]`, `phases[1][j]`, `phases[2][j]`, with `used[j]` blocks held;
        `gained[j * len(rids) + i]` are the blocks request i gained in step j.
        The rows are those `on_step` writes for such steps (steps table, decisions), built at once."""
        if self._event_steps:
            self._run_block_events()
        step0, k, n = self.step, len(starts), len(rids)
        if not k:
            return
        writer = self.writer
        if self._full:
            d = self._decisions
            if self._decode_runs is not None:  # one grid entry for all k steps: no list of its rows
                self._decode_runs.append((len(d["step"]), n * k, step0, n, rids, computed0, gained))
            else:
                for j in range(k):
                    blocks = [gained.get(j * n + i, _NO_BLOCKS) for i in range(n)]
                    self._decode_rows(step0 + j, rids, [c + j for c in computed0], blocks)
        if self._steps and self._step_runs is not None:
            t0 = self.t0
            if t0:
                starts, ends = [s - t0 for s in starts], [e - t0 for e in ends]
            self._step_runs.append((len(self._step_rows), k, n, n, n, range(step0, step0 + k), starts, ends, used,
                                    *phases))
        elif self._steps:
            t0, num_usable = self.t0, self._num_usable_blocks
            rows = self._step_rows
            for j, schedule_time, execute_time, sample_time in zip(range(k), *phases):
                rows.append((step0 + j, starts[j] - t0, ends[j] - t0, 0, n, n, n, 0, 0, used[j], num_usable, 0, 0, 0,
                             schedule_time, execute_time, sample_time, None, None, None, None))
        if not self._direct:
            self._rows_to_writer()
        if self._decode_runs is not None:  # a TraceWriter: one call counts the run's steps
            writer.flush(k)
        else:
            for _ in range(k):
                writer.flush()
        self.step += k

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
