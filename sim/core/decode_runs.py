"""Runs of decode-only steps on the simulated clock: `engine.core.decode_run` applies a stretch of
decode-only steps to the scheduler, and this times them and records them at once
(`TraceRecorder.on_decode_run`: its decision rows as one entry of the writer's row runs, `traces.runs`).
A run also stops before a step that starts at or after the next arrival. So block ids, hashes, times and
every trace table equal the step-by-step loop's (tests/test_decode_runs.py replays workloads both ways and
compares them).

A cost model with `decode_step_times` (the roofline) times a run's steps in one call; the run then
stops only at its block crossings and snapshots, not at every step. Others are asked step by step, as
the loop would ask them (a calibrated model counts each step and may draw its scatter step by step).
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from engine.core.decode_run import DecodeRun, ready_for_decode_run
from engine.core.scheduler import Scheduler
from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModel, DecodeStepTimes
from sim.core.runner import FakeModelRunner
from traces.recorder import TraceRecorder

# Steps looked ahead per run: tokens are drawn for this many steps before the run can tell where it ends.
MAX_RUN = 64


class _Times:
    """What the first `done` steps of a run took: their starts, ends and phases, and the blocks held after
    each (a step interrupted halfway may have some of its entries: they are dropped)."""

    __slots__ = ("starts", "ends", "phases", "used", "done")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.phases: tuple[list[float], list[float], list[float]] = ([], [], [])
        self.used: list[int] = []
        self.done = 0

    def cut(self) -> None:
        for values in (self.starts, self.ends, *self.phases, self.used):
            del values[self.done:]


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
        """The scheduler is in a decode-only stretch and the recorder between steps."""
        return ready_for_decode_run(self.scheduler) and self.recorder.is_between_steps()

    def advance(self, now: float, step: int, next_arrival: float | None, max_steps: int = MAX_RUN) -> tuple[int, float]:
        """Run decode steps from `now` (step index `step`) while no arrival is due at a step's start;
        returns (steps taken, the clock after the last). Call only when `ready()`."""
        if next_arrival is not None and self._last_step > 0:
            # Tokens are drawn for the steps up to about the next arrival, not all max_steps of them: a
            # shorter guess costs one more call, drawing past the arrival is wasted work.
            max_steps = min(max_steps, int((next_arrival - now) / self._last_step) + 2)
        run = DecodeRun.plan(self.scheduler, max_steps, self.runner.upcoming)
        if run is None:
            return 0, now
        times = _Times()
        try:
            n = len(run.rids)
            timings = self.cost_model.decode_step_times(n, n + sum(run.computed0), run.steps)
            if timings is not None:
                self.num_runs_at_once += 1
                now = self._time_at_once(run, times, now, step, next_arrival, timings)
            else:
                now = self._time_each(run, times, now, step, next_arrival)
            if times.done:
                self._last_step = times.ends[-1] - times.starts[-1]
        finally:
            times.cut()
            done = times.done
            self.num_steps += done
            run.end(done)
            self.recorder.on_decode_run(run.rids, run.computed0, times.starts, times.ends, times.phases, times.used,
                                        run.gained, run.num_waiting, run.admission_stop)
        return done, now

    def _cross(self, run: DecodeRun, at: int, step: int) -> bool:
        """Step `at`'s block crossings, and their block events recorded; False where the pool is short."""
        if not run.cross(at):
            return False
        self.recorder.on_decode_step_blocks(step + at)
        return True

    def _time_each(self, run: DecodeRun, times: _Times, now: float, step: int, next_arrival: float | None) -> float:
        """Take the run's steps one at a time, asking the cost model for each; returns the clock after."""
        n, context0 = len(run.rids), len(run.rids) + sum(run.computed0)
        low0, high0 = min(run.computed0) + 1, max(run.computed0) + 1
        free_blocks = self.kv.block_pool.free_block_queue
        num_usable = self.kv.block_pool.num_usable_blocks
        recorder, step_time = self.recorder, self.cost_model.step_time
        starts, ends, used = times.starts, times.ends, times.used
        schedule_times, execute_times, sample_times = times.phases
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
            times.done = done
        return now

    def _time_at_once(self, run: DecodeRun, times: _Times, now: float, step: int, next_arrival: float | None,
                      timings: DecodeStepTimes) -> float:
        """Time every step the run may take in one call, cut it at the first step that starts at or after
        the next arrival, then visit only its block crossings and snapshots, in step order; returns the
        clock after the last step taken."""
        steps = run.steps
        # clock[j]: when step j starts, one step after the other as `now += step time` adds them.
        clock = list(accumulate(timings.totals(), initial=now))
        bound = steps if next_arrival is None else bisect_left(clock, next_arrival, 0, steps)
        pool = self.kv.block_pool
        every = self.recorder.snapshot_every
        used = times.used
        held = pool.num_usable_blocks - pool.free_block_queue.num_free_blocks
        j = 0
        try:
            while True:
                crossing = run.next_crossing()
                if crossing is None:
                    crossing = bound
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
            times.starts, times.ends = clock[:bound], clock[1:bound + 1]
            times.phases = ([0.0] * bound, timings.device[:bound], [timings.host] * bound)
            times.done = bound
        return clock[bound]
