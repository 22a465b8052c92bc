"""Decode runs on the simulated clock: `engine.core.decode_run` applies a stretch of decode-only steps to
the scheduler in closed form, and this times them and hands them to the recorder at once. A run stops
before a step that starts at or after the next arrival, so block ids, hashes, times and every trace table
equal the step-by-step loop's (tests/test_decode_runs.py, tests/test_cluster_runs.py).

A cost model whose `decode_step_times` answers times a run's steps in one call; the run then visits only
its block crossings and snapshots. Others are asked step by step, as the loop would ask them.

In a cluster, replicas touch one another only through the router and the SLO watch. The router reads a
replica when a request arrives, and a run stops before the next arrival anywhere; decode steps add and
free no request, so what it reads mid-run is what it reads step by step. The watch may stop the cluster
at a request that ends on another replica in the middle of a run: `rewind` then takes back the run's
steps that end after the stop (their tokens and counts, which the results read; the blocks stay held,
since the stopped cluster steps no further). A cluster whose trace numbers steps cluster-wide takes no
runs: their steps would interleave with other replicas'.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Protocol

from engine.core.decode_run import DecodeRun, RunTimes, rewind_decode_steps
from engine.core.scheduler import Scheduler
from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModel, DecodeStepTimes
from sim.core.runner import FakeModelRunner

# Steps looked ahead per run: tokens are drawn for this many steps before the run can tell where it ends.
MAX_RUN = 64


class RunRecorder(Protocol):
    """What a decode run tells the trace (traces.recorder.TraceRecorder), or a `RunLog` without one."""

    snapshot_every: int

    def is_between_steps(self) -> bool: ...

    def on_decode_step_blocks(self, step: int) -> None: ...

    def on_decode_run(self, step: int, run: DecodeRun, times: RunTimes) -> None: ...


class RunLog:
    """The recorder of a replica that writes no trace: keeps the last run's requests and step ends, all
    that a rewind needs."""

    snapshot_every = 1 << 62  # no block snapshots without a trace

    def __init__(self) -> None:
        self.rids: list[str] = []
        self.ends: list[float] = []

    def is_between_steps(self) -> bool:
        return True

    def on_decode_step_blocks(self, step: int) -> None:
        pass

    def on_decode_run(self, step: int, run: DecodeRun, times: RunTimes) -> None:
        self.rids, self.ends = run.rids, times.ends


class DecodeRuns:
    """Advances one synchronous replica through decode-only runs: `advance` returns the steps taken."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner, cost_model: CostModel,
                 recorder: RunRecorder | None = None) -> None:
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        self.runner = runner
        self.log: RunLog | None = None
        if recorder is None:
            recorder = self.log = RunLog()
        self.recorder = recorder
        self.cost_model = cost_model
        self.num_runs_at_once = 0  # statistics: runs the cost model timed in one call, steps taken in runs
        self.num_steps = 0
        self._last_step = 0.0  # seconds of the last step of the last run

    def advance(self, now: float, step: int, next_arrival: float | None, max_steps: int = MAX_RUN) -> tuple[int, float]:
        """Run decode steps from `now` (step index `step`) while no arrival is due at a step's start;
        returns (steps taken, the clock after the last): (0, now) outside a decode-only stretch."""
        if not (self.scheduler.decode_only() and self.recorder.is_between_steps()):
            return 0, now
        if next_arrival is not None and self._last_step > 0:
            # Tokens are drawn for the steps up to about the next arrival, not all max_steps of them: a
            # shorter guess costs one more call, drawing past the arrival is wasted work.
            max_steps = min(max_steps, int((next_arrival - now) / self._last_step) + 2)
        run = DecodeRun.plan(self.scheduler, max_steps, self.runner.upcoming)
        if run is None:
            return 0, now
        times = RunTimes()
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
            self.recorder.on_decode_run(step, run, times)
        return done, now

    def rewind(self, t: float) -> int:
        """Take back the last run's steps that end after `t` from its requests; returns how many (a run
        recorded into a trace is not taken back: a traced run is never stopped by a watch)."""
        if self.log is None:
            return 0
        ends = self.log.ends
        k = len(ends) - bisect_right(ends, t)
        if k:
            requests = self.scheduler.requests
            rewind_decode_steps((requests[rid] for rid in self.log.rids), k)
            self.log.ends = ends[:-k]
        return k

    def _cross(self, run: DecodeRun, at: int, step: int) -> bool:
        """Step `at`'s block crossings, and their block events recorded; False where the pool is short."""
        if not run.cross(at):
            return False
        self.recorder.on_decode_step_blocks(step + at)
        return True

    def _time_each(self, run: DecodeRun, times: RunTimes, now: float, step: int, next_arrival: float | None) -> float:
        """Take the run's steps one at a time, asking the cost model for each; returns the clock after."""
        n, context0 = len(run.rids), len(run.rids) + sum(run.computed0)
        low0, high0 = min(run.computed0) + 1, max(run.computed0) + 1
        pool = self.kv.block_pool
        recorder, step_time = self.recorder, self.cost_model.step_time
        starts, ends, used = times.starts, times.ends, times.used
        schedule_times, execute_times, sample_times = times.schedule, times.execute, times.sample
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
            schedule_times.append(0.0)  # the phases as the recorder writes a priced step
            execute_times.append(timing.device)
            sample_times.append(timing.host)
            used.append(pool.get_num_used_blocks())
            done += 1
            times.done = done
        return now

    def _time_at_once(self, run: DecodeRun, times: RunTimes, now: float, step: int, next_arrival: float | None,
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
        held = pool.get_num_used_blocks()
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
                held = pool.get_num_used_blocks()
                j = at + 1
        except BaseException:  # interrupted (Ctrl-C): the run ends after the last event visited whole
            bound = j
            raise
        finally:
            used.extend([held] * (bound - len(used)))
            del used[bound:]
            times.starts, times.ends = clock[:bound], clock[1:bound + 1]
            times.schedule, times.execute, times.sample = [0.0] * bound, timings.device[:bound], [timings.host] * bound
            times.done = bound
        return clock[bound]
