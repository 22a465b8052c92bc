"""Runs of decode-only steps, advanced without a SchedulerOutput per step.

Most steps of a long replay change nothing but counts: every running request decodes one token, and
nobody waits, arrives, finishes or is preempted. For such a step `Scheduler.schedule` gives each running
request one token (and a block, or a block published, where it crosses its `slot_limit`) and
`update_from_output` appends the sampled token. `DecodeRuns.advance` does exactly that for a run of
steps: the KV cache manager's own `allocate_slots` at each crossing, in the scheduler's order, tokens
appended in bulk, and the whole run recorded at once (`TraceRecorder.on_decode_run`: its decision rows
as one entry of the writer's row runs, `traces.runs`). A run stops before any
step that could differ: an arrival, a token that may stop a request, a step short of free blocks. So
block ids, hashes, times and every trace table equal the step-by-step loop's
(tests/test_decode_runs.py replays workloads both ways and compares them).

A cost model with `decode_step_times` (the roofline) times a run's steps in one call; the run then
stops only at its block crossings and snapshots, not at every step. Others are asked step by step, as
the loop would ask them (a calibrated model counts each step and may draw its scatter step by step).
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModel, StepTiming
from sim.core.runner import FakeModelRunner
from traces.recorder import TraceRecorder

# Steps looked ahead per run: tokens are drawn for this many steps before the run can tell where it ends.
MAX_RUN = 64


class _Run:
    """One run while it advances: its requests and the tokens drawn for them, the run steps at which each
    next crosses its slot limit, and what the steps taken so far did."""

    __slots__ = ("running", "rids", "computed0", "tokens", "steps", "crossings", "applied", "gained", "starts",
                 "ends", "phases", "used", "done")

    def __init__(self, running: list[Request], tokens: list[list[int]], steps: int, slot_limit: dict[str, int]) -> None:
        self.running = running
        self.rids = [r.request_id for r in running]
        self.computed0 = [r.num_computed_tokens for r in running]
        self.tokens = tokens
        self.steps = steps
        self.crossings: dict[int, list[int]] = {}  # step in the run -> running indices that call allocate_slots
        for i, (rid, c) in enumerate(zip(self.rids, self.computed0)):
            j = slot_limit[rid] - c
            if j < steps:
                self.crossings.setdefault(j, []).append(i)
        self.applied = [0] * len(running)  # per request, tokens of the run appended so far
        self.gained: dict[int, list[int]] = {}  # j * n + i -> the blocks request i gained in step j
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.phases: tuple[list[float], list[float], list[float]] = ([], [], [])
        self.used: list[int] = []
        self.done = 0


class DecodeRuns:
    """Advances the synchronous simulator through decode-only runs; `advance` returns the steps taken."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner, recorder: TraceRecorder,
                 cost_model: CostModel) -> None:
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        self.runner = runner
        self.recorder = recorder
        self.cost_model = cost_model
        self.num_runs_at_once = 0  # runs whose steps the cost model timed in one call
        self.num_steps = 0  # steps taken in runs, of the whole replay
        self._last_step = 0.0  # seconds of the last step of the last run

    def ready(self) -> bool:
        """Every running request is a plain decode and nothing else waits to happen before the next step.
        Finishes still to be announced do not count: the next schedule() only hands them to the workers,
        which the simulator has none of (the loop told the fake runner when they finished)."""
        s = self.scheduler
        running = s.running
        if (not running or s.waiting or s.has_pending_outputs() or s.has_placeholders
                or len(running) > s.max_num_scheduled_tokens or not self.recorder.is_between_steps()):
            return False
        for req in running:
            if (req.num_computed_tokens != len(req.all_token_ids) - 1 or req.is_prefill_chunk
                    or req.num_in_flight_tokens or not req.output_token_ids):
                return False
        return True

    def advance(self, now: float, step: int, next_arrival: float | None, max_steps: int = MAX_RUN) -> tuple[int, float]:
        """Run decode steps from `now` (step index `step`) while no arrival is due at a step's start;
        returns (steps taken, the clock after the last). Call only when `ready()`."""
        run = self._plan(now, next_arrival, max_steps)
        if run is None:
            return 0, now
        try:
            n = len(run.rids)
            times = self.cost_model.decode_step_times(n, n + sum(run.computed0), run.steps)
            if times is not None:
                self.num_runs_at_once += 1
                now = self._time_at_once(run, now, step, next_arrival, times)
            else:
                now = self._time_each(run, now, step, next_arrival)
            if run.done:
                self._last_step = run.ends[-1] - run.starts[-1]
        finally:
            self.num_steps += run.done
            if run.done and self.scheduler.finished_req_ids:
                self.scheduler.finished_req_ids = set()  # announced by the run's first step, as schedule() does
            for i, req in enumerate(run.running):
                _catch_up(req, run.tokens[i], run.applied[i], run.done)
                req.num_computed_tokens = run.computed0[i] + run.done
            self.recorder.on_decode_run(run.rids, run.computed0, run.starts, run.ends, run.phases, run.used,
                                        run.gained)
        return run.done, now

    def _plan(self, now: float, next_arrival: float | None, max_steps: int) -> _Run | None:
        """How many steps the run may take at most, and the tokens its requests sample in them; None
        when not even one."""
        running = list(self.scheduler.running)
        steps = max_steps
        if next_arrival is not None and self._last_step > 0:
            # Tokens are drawn for the steps up to about the next arrival, not all max_steps of them: a
            # shorter guess costs one more call, drawing past the arrival is wasted work.
            steps = min(steps, int((next_arrival - now) / self._last_step) + 2)
        for req in running:  # the step that reaches max_tokens (or max_model_len) finishes: not in a run
            left = req.num_tokens_limit - len(req.all_token_ids) - 1
            if left < steps:
                steps = left
        if steps <= 0:
            return None
        upcoming = self.runner.upcoming
        tokens = []
        for req in running:
            toks = upcoming(req.request_id, len(req.output_token_ids), steps)
            stop = req.stop_token_set
            if stop:
                for j, t in enumerate(toks):
                    if t in stop:  # may stop it (check_stop decides): that step is the loop's
                        steps = j
                        break
            tokens.append(toks)
        if steps <= 0:
            return None
        return _Run(running, tokens, steps, self.kv.slot_limit)

    def _cross(self, run: _Run, done: int, step: int) -> bool:
        """Run step `done`'s block crossings, in the scheduler's order, and record its block events;
        False, with nothing done, where the pool is short (the scheduler would preempt)."""
        due = run.crossings.pop(done)
        due.sort()
        kv, computed0, rids = self.kv, run.computed0, run.rids
        req_blocks, block_size, slot_limit = kv.req_to_blocks, kv.block_size, kv.slot_limit
        num_free = kv.block_pool.free_block_queue.num_free_blocks
        # A decode needs at most one new block: only a pool with fewer free blocks than crossings is checked.
        if len(due) > num_free and sum(1 for i in due if computed0[i] + done + 1
                                       > len(req_blocks[rids[i]]) * block_size) > num_free:
            return False
        n = len(rids)
        for i in due:
            req = run.running[i]
            _catch_up(req, run.tokens[i], run.applied[i], done)
            run.applied[i] = done
            req.num_computed_tokens = computed0[i] + done
            new_blocks = kv.allocate_slots(req, 1)
            if new_blocks:
                run.gained[done * n + i] = [b.block_id for b in new_blocks]
            j = slot_limit[rids[i]] - computed0[i]
            if j < run.steps:
                run.crossings.setdefault(j, []).append(i)
        self.recorder.on_decode_step_blocks(step + done)
        return True

    def _time_each(self, run: _Run, now: float, step: int, next_arrival: float | None) -> float:
        """Take the run's steps one at a time, asking the cost model for each; returns the clock after."""
        n, context0 = len(run.rids), len(run.rids) + sum(run.computed0)
        low0, high0 = min(run.computed0) + 1, max(run.computed0) + 1
        free_blocks = self.kv.block_pool.free_block_queue
        num_usable = self.kv.block_pool.num_usable_blocks
        cost, recorder = self.cost_model, self.recorder
        step_time = cost.step_time
        starts, ends, used = run.starts, run.ends, run.used
        schedule_times, execute_times, sample_times = run.phases
        done = 0
        while done < run.steps:
            if next_arrival is not None and next_arrival <= now:
                break
            if done in run.crossings:
                if not self._cross(run, done, step):
                    break
            elif (step + done) % recorder.snapshot_every == 0:
                recorder.on_decode_step_blocks(step + done)
            timing = step_time(StepBatch(0, n, 0, n, context0 + n * done, 0.0, [], low0 + done, high0 + done),
                               step + done)
            starts.append(now)
            now += timing.total
            ends.append(now)
            schedule_times.append(0.0)  # the phases as CycleRecorder writes them
            execute_times.append(timing.device)
            sample_times.append(timing.host)
            used.append(num_usable - free_blocks.num_free_blocks)
            done += 1
            run.done = done
        return now

    def _time_at_once(self, run: _Run, now: float, step: int, next_arrival: float | None,
                      times: list[StepTiming]) -> float:
        """Time every step the run may take in one call, cut it at the first step that starts at or after
        the next arrival, then visit only its block crossings and snapshots, in step order; returns the
        clock after the last step taken."""
        steps = run.steps
        # clock[j]: when step j starts, one step after the other as `now += step time` adds them.
        clock = list(accumulate([t.total for t in times], initial=now))
        bound = steps if next_arrival is None else bisect_left(clock, next_arrival, 0, steps)
        pool = self.kv.block_pool
        every = self.recorder.snapshot_every
        used = run.used
        held = pool.num_usable_blocks - pool.free_block_queue.num_free_blocks
        j = 0
        try:
            while True:
                crossing = min(run.crossings) if run.crossings else bound
                snapshot = j + (-(step + j)) % every
                at = crossing if crossing <= snapshot else snapshot
                if at >= bound:
                    break
                if at == crossing:
                    if not self._cross(run, at, step):
                        bound = at
                        break
                else:
                    self.recorder.on_decode_step_blocks(step + at)
                used.extend([held] * (at - len(used)))  # the steps before it hold what the last event left
                held = pool.num_usable_blocks - pool.free_block_queue.num_free_blocks
                j = at + 1
        except BaseException:  # interrupted (Ctrl-C): the run ends after the last event visited whole
            bound = j
            raise
        finally:
            used.extend([held] * (bound - len(used)))
            del used[bound:]
            run.starts, run.ends = clock[:bound], clock[1:bound + 1]
            taken = times[:bound]
            run.phases = ([0.0] * bound, [t.device for t in taken], [t.host for t in taken])
            run.done = bound
        return clock[bound]


def _catch_up(req: Request, tokens: list[int], applied: int, upto: int) -> None:
    """Append the run's tokens of steps applied .. upto - 1, as update_from_output would have."""
    if upto <= applied:
        return
    new = tokens[applied:upto]
    req.output_token_ids.extend(new)
    all_ids = req.all_token_ids
    all_ids.extend(new)
    # Hashed only once a block has filled: half the calls come at a crossing that allocates a block,
    # one step after the crossing that filled (and published) the last one.
    if req.block_size and len(all_ids) // req.block_size > len(req.block_hashes):
        req.update_block_hashes()
