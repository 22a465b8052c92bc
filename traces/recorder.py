"""Turns what the shared scheduler did each step into trace rows; the engine and the simulator both
call it, which is what makes their traces comparable row for row.

Rows are kept as columns (one list per column, extended per step) and handed to the writer as such: a
simulated step costs microseconds. A step in which every request decodes one token, the common step of
a long replay, and a decode run of many such steps (`engine.core.decode_run`) go to a batched writer as
one grid entry (`traces.runs`), with no list of their rows at all."""
from __future__ import annotations

from itertools import chain, repeat
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Generic, Protocol, TypeVar

from engine.core.decode_run import DecodeRun, RunTimes
from engine.core.kv_cache_manager import BlockEvent
from engine.core.outputs import EngineCoreOutputs
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCost, StepTimes
from traces.runs import GridSpec, RunEntry, RunSpec
from traces.schema import ADMISSION_COLUMNS, BLOCK_EVENT_COLUMNS, OPTIONAL_COLUMNS, TABLES, DecisionRow, StepRow

# full: every table; steps: steps and requests (no decisions, block events or snapshots); none:
# requests only (per-request metrics, for sweeps).
TRACE_LEVELS = ("full", "steps", "none")
_NO_BLOCKS: tuple[int, ...] = ()
NO_ADMISSION_STOP = (None, None, None, None)  # a step whose waiting queue stopped for nothing
NO_MOE_STATS = (None, None, None)  # a dense model's step, or a simulated one
# The common step, every running request decoding one token, as one grid run of decision rows per step or
# per decode run: (position, count, first step, n, request ids, computed counts at the first step,
# {row: new block ids}).
DECODE_RUN = GridSpec(step="step", per_seat="request_id", counting="num_computed_tokens", sparse="blocks_gained",
                      constants={"event": "schedule", "num_tokens": 1, "phase": "decode", "prefix_hit_tokens": 0,
                                 "blocks_freed": _NO_BLOCKS})


def _step_run_spec(num_usable_blocks: int) -> RunSpec:
    """A decode run's steps rows as one run entry: what differs between its steps per row, what is the
    same in each of them per run, the rest constant (the MoE columns null: only a simulator runs them)."""
    return RunSpec(per_run=("num_decode_tokens", "num_scheduled_tokens", "num_running", "num_waiting",
                            *ADMISSION_COLUMNS),
                   per_row=("step", "start", "end", "kv_blocks_used", "schedule_time", "execute_time", "sample_time"),
                   constants={"num_prefill_tokens": 0, "num_preempted": 0, "prefix_hit_tokens": 0,
                              "kv_blocks_total": num_usable_blocks, "num_new_reqs": 0, "num_finished": 0})


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


class BlockRead(Protocol):
    @property
    def block_id(self) -> int: ...

    @property
    def block_hash(self) -> bytes | None: ...


class PoolRead(Protocol):
    """What a recorder reads of a block pool (engine.core's BlockPool, or a view of vLLM's)."""

    @property
    def num_usable_blocks(self) -> int: ...

    @property
    def blocks(self) -> Sequence[BlockRead]: ...

    def get_num_free_blocks(self) -> int: ...


class KVRead(Protocol):
    """What a recorder reads of a KV cache manager; it installs its own block event log in `events`."""

    events: list[BlockEvent] | None

    @property
    def block_pool(self) -> PoolRead: ...

    @property
    def req_to_blocks(self) -> Mapping[str, Sequence[BlockRead]]: ...


class SchedulerRead(Protocol):
    """What a recorder reads of a scheduler after a step: the queues' lengths and the KV cache."""

    @property
    def running(self) -> Sized: ...

    @property
    def waiting(self) -> Sized: ...

    @property
    def kv_cache_manager(self) -> KVRead: ...


class RequestRead(Protocol):
    """What the `requests` table holds of a request (engine.core's Request, or a record of vLLM's)."""

    request_id: str
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_cached_tokens: int
    num_preemptions: int
    priority: int
    max_tokens: int | None
    error: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]

    @property
    def queued_time(self) -> float | None: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    def is_finished(self) -> bool: ...

    def get_finish_reason(self) -> str | None: ...


R = TypeVar("R", bound=RequestRead)


class TraceSink(Protocol):
    """Where a recorder's rows go (a `TraceWriter`, or a wrapper such as a cluster replica's). A `columnar`
    sink also lends the recorder its column buffers (`buffer`, `row_buffer`, `run_buffer`: no dict per row);
    the others get each step's rows through `write_rows`."""

    columnar: bool

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def update_meta(self, **fields: Any) -> None: ...

    def flush(self, steps: int = 1) -> None: ...

    def close(self, compact: bool = True, **final_meta: Any) -> None: ...

    def buffer(self, table: str) -> dict[str, list[Any]]: ...

    def row_buffer(self, table: str) -> list[tuple[object, ...]]: ...

    def run_buffer(self, table: str, spec: RunSpec | GridSpec) -> list[RunEntry] | None: ...


class TraceRecorder(Generic[R]):
    """Call `on_add` for every request, `on_step` after every step (`on_decode_run` for a run of decode
    steps), `on_abort` for aborts, `close` at the end. Steps are numbered by the caller (the step cycle
    owns the count)."""

    def __init__(self, writer: TraceSink, scheduler: SchedulerRead, t0: float = 0.0,
                 snapshot_every: int = 1024, trace_level: str = "full") -> None:
        self.writer = writer
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        # Read for every steps row: the pool's size is fixed (engine.core's pool or a view of vLLM's).
        self._num_usable_blocks = self.kv.block_pool.num_usable_blocks
        self._num_free_blocks = self.kv.block_pool.get_num_free_blocks
        self.t0 = t0
        self.snapshot_every = snapshot_every
        self.num_steps = 0  # steps recorded: one past the last step's number
        self.live: dict[str, R] = {}
        # Columns go straight into a columnar writer's buffers; another gets this step's columns as rows
        # after each step.
        self._direct = writer.columnar
        names = ("decisions", "block_events")
        self._tables = ({t: writer.buffer(t) for t in names} if self._direct
                        else {t: {c: [] for c in TABLES[t] + OPTIONAL_COLUMNS.get(t, ())} for t in names})
        self._decisions = self._tables["decisions"]
        self._decision_cols = [self._decisions[c] for c in DecisionRow._fields[:len(TABLES["decisions"])]]
        self._step_rows: list[tuple[object, ...]] = writer.row_buffer("steps") if self._direct else []
        self._event_cols = [self._tables["block_events"][c] for c in BLOCK_EVENT_COLUMNS]
        self._events: list[BlockEvent] = []  # the pool's log at the full level (KVCacheManager.events)
        self._pending_decisions: list[tuple[str, str, list[int] | None, str | None]] = []
        self._pending_requests: list[dict[str, Any]] = []
        # A batched writer takes decode steps as row runs (traces.runs); others get their rows.
        self._step_run_spec = _step_run_spec(self._num_usable_blocks)
        self._decode_runs = writer.run_buffer("decisions", DECODE_RUN) if self._direct else None
        self._step_runs = writer.run_buffer("steps", self._step_run_spec) if self._direct else None
        # In a decode run, (step, how many of the pool's events it made) per step that made some, and how
        # many events those steps made in all (on_decode_step_blocks).
        self._event_steps: list[tuple[int, int]] = []
        self._events_marked = 0
        self.set_trace_level(trace_level)

    def set_trace_level(self, level: str) -> None:
        """`full`, `steps` or `none` (TRACE_LEVELS); below full the block pool stops logging events too."""
        if level not in TRACE_LEVELS:
            raise ValueError(f"--trace-level: must be one of {', '.join(TRACE_LEVELS)}, got {level!r}")
        self.trace_level = level
        self._full = level == "full"
        self._steps = level != "none"
        self._events.clear()
        self.kv.events = self._events if self._full else None
        self.writer.update_meta(trace_level=level)

    def on_add(self, request: R) -> None:
        """After scheduler.add_request: remember it; a rejected one is recorded at the next step."""
        if request.is_finished():
            if self._full:
                self._pending_decisions.append((request.request_id, "reject", None, "error"))
            self._pending_requests.append(self._request_row(request))
        else:
            self.live[request.request_id] = request

    def on_abort(self, freed: dict[str, list[int]]) -> list[R]:
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

    def on_step(self, step: int, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes,
                cost: StepCost | None = None) -> list[R]:
        """Record step `step`; returns the requests that finished in it. Its phases are the gaps between
        `times`, or where the step was priced (a simulator's), the cost's device and host time."""
        finished: list[R] = []
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
            if self._events:
                self._block_events(step)
            if step % self.snapshot_every == 0:
                writer.write_rows("block_snapshots", self.block_snapshot(step))
        if self._steps:
            t_schedule, t_execute, t_sample, t_update, t_end = times
            if cost is None:
                phases = (t_execute - t_schedule, t_sample - t_execute, t_update - t_sample)
            else:
                phases = (0.0, cost.device, cost.host)
            sched, t0 = self.scheduler, self.t0
            num_usable = self._num_usable_blocks
            stop = so.admission_stop  # why the waiting queue stopped being admitted
            rid, reason, needed, available = NO_ADMISSION_STOP if stop is None else stop
            moe = outputs.moe_stats  # a MoE model's routing (the live engine only)
            moe_max, moe_mean, moe_tokens = NO_MOE_STATS if moe is None else (
                moe.experts_active_max, moe.experts_active_mean, moe.expert_tokens_max)
            self._step_rows.append(StepRow(
                step=step, start=t_schedule - t0, end=t_end - t0, num_prefill_tokens=so.num_prefill_tokens,
                num_decode_tokens=so.num_decode_tokens, num_scheduled_tokens=so.total_num_scheduled_tokens,
                num_running=len(sched.running), num_waiting=len(sched.waiting),
                num_preempted=len(so.preempted_req_ids), kv_blocks_used=num_usable - self._num_free_blocks(),
                kv_blocks_total=num_usable, prefix_hit_tokens=so.prefix_hit_tokens,
                num_new_reqs=len(so.scheduled_new_reqs), num_finished=num_finished, schedule_time=phases[0],
                execute_time=phases[1], sample_time=phases[2], admission_blocked=reason,
                admission_blocked_request=rid, admission_needed=needed, admission_available=available,
                moe_experts_active_max=moe_max, moe_experts_active_mean=moe_mean, moe_expert_tokens_max=moe_tokens))
        if not self._direct:
            self._rows_to_writer()
        writer.flush()
        self.num_steps = step + 1
        return finished

    def _schedule_decisions(self, so: SchedulerOutput, step: int) -> None:
        """Pending (between-step) rows, then one schedule row per scheduled request, then preemptions."""
        if self._pending_decisions:
            for rid, event, freed, reason in self._pending_decisions:
                self._decision(step, rid, event, freed, reason)
            self._pending_decisions.clear()
        num_tokens = so.num_scheduled_tokens
        for new in so.scheduled_new_reqs:
            computed = new.num_computed_tokens
            self._append(DecisionRow(step=step, request_id=new.req_id, event="schedule",
                                     num_tokens=num_tokens[new.req_id], phase="prefill", num_computed_tokens=computed,
                                     prefix_hit_tokens=computed, blocks_gained=new.block_ids, blocks_freed=_NO_BLOCKS,
                                     finish_reason=None))
        if so.scheduled_cached_reqs.req_ids:
            self._cached_decisions(so, step)
        for rid in so.preempted_req_ids:
            forced_by, needed, free = (so.preempted_for or {}).get(rid, (None, None, None))  # whom it served
            self._append(DecisionRow(step=step, request_id=rid, event="preempt", num_tokens=0, phase=None,
                                     num_computed_tokens=None, prefix_hit_tokens=0,
                                     blocks_gained=_NO_BLOCKS, blocks_freed=so.preempted_block_ids[rid],
                                     finish_reason=None, preempted_for=forced_by, blocks_needed=needed,
                                     blocks_free=free))

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
        """A row that schedules nothing: finish, abort or reject."""
        self._append(DecisionRow(step=step, request_id=rid, event=event, num_tokens=0, phase=None,
                                 num_computed_tokens=None, prefix_hit_tokens=0, blocks_gained=_NO_BLOCKS,
                                 blocks_freed=freed or _NO_BLOCKS, finish_reason=reason))

    def _append(self, row: DecisionRow) -> None:
        """One decision row; the optional columns are sparse, so set only where a value is given."""
        for col, value in zip(self._decision_cols, row):
            col.append(value)
        if row.preempted_for is not None:
            _set_on_last_row(self._decisions, {"preempted_for": row.preempted_for, "blocks_needed": row.blocks_needed,
                                               "blocks_free": row.blocks_free})

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
            self.writer.write_rows("steps", [dict(zip(StepRow._fields, row)) for row in self._step_rows])
            self._step_rows.clear()

    def _block_events(self, step: int) -> None:
        events = self._events
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

    # ---- decode steps ----------------------------------------------------------------------------
    def _decode_rows(self, step: int, rids: list[str], computed: list[int], block_ids: list[list[int]]) -> None:
        """The schedule rows of a step in which every scheduled request decodes one token."""
        n = len(rids)
        if self._decode_runs is not None:
            gained = {i: ids for i, ids in enumerate(block_ids) if ids}
            self._decode_runs.append((len(self._decisions["step"]), n, step, n, rids, computed, gained))
            return
        d = self._decisions
        d["step"].extend([step] * n)
        d["request_id"].extend(rids)
        d["event"].extend(["schedule"] * n)
        d["num_tokens"].extend([1] * n)
        d["phase"].extend(["decode"] * n)
        d["num_computed_tokens"].extend(computed)
        d["prefix_hit_tokens"].extend([0] * n)
        d["blocks_gained"].extend(block_ids)
        d["blocks_freed"].extend([_NO_BLOCKS] * n)
        d["finish_reason"].extend([None] * n)

    def on_decode_step_blocks(self, step: int) -> None:
        """During a decode run, after step `step`'s block crossings: which of the pool's events are its
        own (they become rows with the run's), and the pool's snapshot if one is due."""
        if self._full:
            num_events = len(self._events)
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
        events = self._events  # those after the last mark (a run cut short mid-step) wait for on_step
        for col, values in zip((kind, rid, ids, hashes), zip(*events[:self._events_marked])):
            col.extend(values)
        del events[:self._events_marked]
        marks.clear()
        self._events_marked = 0

    def on_decode_run(self, step: int, run: DecodeRun, times: RunTimes) -> None:
        """Record the steps of a decode run from step `step` on: the rows `on_step` writes for such
        steps, built at once (for a batched writer, one entry per table)."""
        if self._event_steps:
            self._run_block_events()
        k, n = times.done, len(run.rids)
        if not k:
            return
        if self._full:
            if self._decode_runs is not None:
                self._decode_runs.append((len(self._decisions["step"]), n * k, step, n, run.rids, run.computed0,
                                          run.gained))
            else:
                for j in range(k):
                    blocks = [run.gained.get(j * n + i, []) for i in range(n)]
                    self._decode_rows(step + j, run.rids, [c + j for c in run.computed0], blocks)
        if self._steps:
            rid, reason, needed, available = run.admission_stop or NO_ADMISSION_STOP
            t0 = self.t0
            starts, ends = times.starts, times.ends
            if t0:
                starts, ends = [s - t0 for s in starts], [e - t0 for e in ends]
            if self._step_runs is not None:
                self._step_runs.append(self._step_run_spec.entry(
                    len(self._step_rows), k, num_decode_tokens=n, num_scheduled_tokens=n, num_running=n,
                    num_waiting=run.num_waiting, admission_blocked=reason, admission_blocked_request=rid,
                    admission_needed=needed, admission_available=available, step=range(step, step + k),
                    start=starts, end=ends, kv_blocks_used=times.used, schedule_time=times.schedule,
                    execute_time=times.execute, sample_time=times.sample))
            else:
                num_usable = self._num_usable_blocks
                for j in range(k):
                    self._step_rows.append(StepRow(
                        step=step + j, start=starts[j], end=ends[j], num_prefill_tokens=0, num_decode_tokens=n,
                        num_scheduled_tokens=n, num_running=n, num_waiting=run.num_waiting, num_preempted=0,
                        kv_blocks_used=times.used[j], kv_blocks_total=num_usable, prefix_hit_tokens=0,
                        num_new_reqs=0, num_finished=0, schedule_time=times.schedule[j],
                        execute_time=times.execute[j], sample_time=times.sample[j], admission_blocked=reason,
                        admission_blocked_request=rid, admission_needed=needed, admission_available=available))
        if not self._direct:
            self._rows_to_writer()
        self.writer.flush(k)
        self.num_steps = step + k

    def close(self, **final_meta: Any) -> None:
        """Write what is pending (aborts after the last step, requests still unfinished) and compact."""
        rows = list(self._pending_requests)
        for req in self.live.values():
            rows.append(self._request_row(req))
        self.writer.write_rows("requests", rows)
        last = max(self.num_steps - 1, 0)
        if self._full:
            for rid, event, freed, reason in self._pending_decisions:
                self._decision(self.num_steps - 1, rid, event, freed, reason)
            self._pending_decisions.clear()
            self._block_events(last)
            if not self._direct:
                self._rows_to_writer()
        self.writer.close(num_steps=self.num_steps, **final_meta)

    def _request_row(self, r: RequestRead) -> dict[str, Any]:
        t0 = self.t0
        return {"request_id": r.request_id, "arrival": r.arrival_time - t0, "queued": _t(r.queued_time, t0),
                "first_scheduled": _t(r.first_scheduled_time, t0), "first_token": _t(r.first_token_time, t0),
                "finish": _t(r.finished_time, t0), "num_prompt_tokens": r.num_prompt_tokens,
                "num_output_tokens": r.num_output_tokens, "num_cached_tokens": max(r.num_cached_tokens, 0),
                "num_preemptions": r.num_preemptions, "finish_reason": r.get_finish_reason(),
                "priority": r.priority, "max_tokens": r.max_tokens, "error": r.error,
                "prompt_token_ids": r.prompt_token_ids, "output_token_ids": r.output_token_ids}
