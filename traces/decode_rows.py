"""The decode-run half of `TraceRecorder`: the rows of steps in which every scheduled request decodes
one token, the common step of a long replay. Such a step's decision rows differ only in their request,
computed count and new blocks, so they go to a batched writer as one grid entry (`traces.runs`), and a
decode run of many steps (`sim.core.decode_runs`) as one entry per table, its block events in one pass."""
from __future__ import annotations

from collections.abc import Callable
from itertools import chain, repeat

from traces.runs import GridSpec, RunSpec
from traces.schema import OPTIONAL_COLUMNS

_NO_BLOCKS: tuple[int, ...] = ()
NO_ADMISSION_STOP = (None, None, None, None)  # a steps row whose waiting queue stopped for nothing
# The common step, every running request decoding one token, as one grid run of decision rows per step or
# per decode run of steps (sim.core.decode_runs): (position, count, first step, n, request ids, computed counts
# at the first step, {row: new block ids}).
DECODE_RUN = GridSpec(step="step", per_seat="request_id", counting="num_computed_tokens", sparse="blocks_gained",
                      constants={"event": "schedule", "num_tokens": 1, "phase": "decode", "prefix_hit_tokens": 0,
                                 "blocks_freed": _NO_BLOCKS})


def _step_run_spec(num_usable_blocks: int) -> RunSpec:
    """A decode run's steps rows as one run entry: (position, k, n, n, n, requests waiting, the admission
    stop's four fields, steps, starts, ends, blocks used, the three phases); every other column is the same
    in each of its steps."""
    return RunSpec(per_run=("num_decode_tokens", "num_scheduled_tokens", "num_running", "num_waiting",
                            *OPTIONAL_COLUMNS["steps"]),
                   per_row=("step", "start", "end", "kv_blocks_used", "schedule_time", "execute_time", "sample_time"),
                   constants={"num_prefill_tokens": 0, "num_preempted": 0, "prefix_hit_tokens": 0,
                              "kv_blocks_total": num_usable_blocks, "num_new_reqs": 0, "num_finished": 0})


class DecodeRunRows:
    """Mixed into TraceRecorder, whose buffers (`_decisions`, `_step_rows`, `_event_cols`), trace level
    and pool it writes to."""

    def _init_decode_rows(self, run_buffer: Callable[[str, GridSpec | RunSpec], list[tuple] | None] | None) -> None:
        """`run_buffer`: the writer's, where it takes row runs (a batched writer's Arrow stream), else None:
        rows are then appended from lists that do not depend on the step."""
        self._decode_runs = run_buffer("decisions", DECODE_RUN) if run_buffer is not None else None
        self._step_runs = run_buffer("steps", _step_run_spec(self._num_usable_blocks)) if run_buffer is not None else None
        self._decode_consts: dict[int, tuple[list, ...]] = {}
        # In a decode run, (step, how many of the pool's events it made) per step that made some, and
        # how many events those steps made in all (on_decode_step_blocks).
        self._event_steps: list[tuple[int, int]] = []
        self._events_marked = 0

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

    def on_decode_step_blocks(self, step: int) -> None:
        """During a decode run (`sim.core.decode_runs`), after step `step`'s block crossings: which of the
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
                      gained: dict[int, list[int]], num_waiting: int,
                      admission_stop: tuple[str, str, int, int] | None) -> None:
        """Record the steps of a decode run: every request of `rids` decodes one token per step, from
        `computed0` computed tokens; step j ran `starts[j]`..`ends[j]`, its schedule, execute and sample
        times `phases[0][j]`, `phases[1][j]`, `phases[2][j]`, with `used[j]` blocks held;
        `gained[j * len(rids) + i]` are the blocks request i gained in step j; `num_waiting` requests
        waited in each step, not admitted for `admission_stop` (request, reason, needed, available).
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
            rid, reason, needed, available = admission_stop or NO_ADMISSION_STOP
            self._step_runs.append((len(self._step_rows), k, n, n, n, num_waiting, reason, rid, needed, available,
                                    range(step0, step0 + k), starts, ends, used, *phases))
        elif self._steps:
            t0, num_usable = self.t0, self._num_usable_blocks
            rid, reason, needed, available = admission_stop or NO_ADMISSION_STOP
            rows = self._step_rows
            for j, schedule_time, execute_time, sample_time in zip(range(k), *phases):
                rows.append((step0 + j, starts[j] - t0, ends[j] - t0, 0, n, n, n, num_waiting, 0, used[j], num_usable,
                             0, 0, 0, schedule_time, execute_time, sample_time, reason, rid, needed, available))
        if not self._direct:
            self._rows_to_writer()
        if self._decode_runs is not None:  # a TraceWriter: one call counts the run's steps
            writer.flush(k)
        else:
            for _ in range(k):
                writer.flush()
        self.step += k
