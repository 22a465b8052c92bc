"""The discrete-event loop: one engine replica on a simulated clock.

Two kinds of events move the clock: a request arriving (it is added to the scheduler at that time) and
a step completing (the step started when the previous one ended, or at the next arrival if the engine
was idle, and lasts what the cost model says for the batch the scheduler produced). The scheduler, KV
cache manager and block pool are `engine.core`'s own, with `clock` reading the simulated time, and every
step is recorded through `traces.recorder.TraceRecorder`, so the trace is the engine's format.

Recorded replays (a cost model with `step_start`, i.e. `recorded`) follow the engine's clock exactly:
each request is added at its recorded `queued` time (when the engine's scheduler saw it, which decides
the step it can first be scheduled in) and step i starts at the recorded start of step i, not merely
after the previous step's duration, since the engine's loop spends time between steps too.
"""
from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.async_scheduler import make_scheduler
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request, RequestStatus
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCycle, StepTimes
from sim.cost_models.batch import batch_from_output
from sim.cost_models.base import CostModel, StepTiming
from sim.core.decode_runs import MAX_RUN, DecodeRuns
from sim.core.runner import FakeModelRunner
from sim.core.sources import SimRequest, make_request
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED}


class CycleRecorder:
    """A TraceRecorder as the step cycle's recorder: a step's row spans the cycle's clock, and its phases
    are the cost model's timing of that step (execute: the device time, sample: the host time), which
    `launch` hands over as it launches the step."""

    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder
        # By id() of the step's SchedulerOutput: async scheduling records steps that launched earlier.
        self._timings: dict[int, StepTiming] = {}

    def timed(self, so: SchedulerOutput, timing: StepTiming) -> None:
        self._timings[id(so)] = timing

    def on_add(self, request: Request) -> None:
        self.recorder.on_add(request)

    def on_abort(self, freed: dict[str, list[int]]) -> list[Request]:
        return self.recorder.on_abort(freed)

    def on_step(self, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes) -> list[Request]:
        timing = self._timings.pop(id(so))
        return self.recorder.on_step(so, outputs, times[0], times[-1], 0.0, timing.device, timing.host)


def launch(cycle: StepCycle, cost_model: CostModel, step: int,
           recorder: CycleRecorder | None) -> tuple[SchedulerOutput, StepTiming]:
    """Schedule and launch the next step and time it (`step`: its index), for every loop: the recorder,
    if the loop writes a trace, keeps the timing until it records the step."""
    so = cycle.begin()
    timing = cost_model.step_time(batch_from_output(so), step)
    if recorder is not None:
        recorder.timed(so, timing)
    return so, timing


@contextmanager
def fewer_collections(threshold: int = 100_000):
    """The loop allocates millions of short-lived objects next to long-lived ones; the default GC
    thresholds rescan the long-lived heap over and over (a third of the run time)."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


class SimulationError(RuntimeError):
    """The simulation cannot go on (e.g. waiting requests that can never be scheduled)."""


@dataclass(slots=True, kw_only=True)
class SimResult:
    trace_dir: Path
    num_steps: int
    num_requests: int
    sim_time: float
    wall_time: float
    interrupted: bool


class Simulator:
    """Build once per run; `run(requests)` drives the scheduler to completion and closes the trace."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, cost_model: CostModel,
                 trace_dir: str | Path, meta: dict[str, Any] | None = None, seed: int = 0,
                 vocab_size: int = 32000, follow_recorded: bool = False, flush_every: int = 1024,
                 snapshot_every: int | None = None, trace_level: str = "full", decode_runs: bool = True,
                 overwrite: bool = False) -> None:
        self.now = 0.0
        self.cost_model = cost_model
        self.scheduler = make_scheduler(scheduler_config, cache_config, clock=self.clock)
        self.runner = FakeModelRunner(seed, vocab_size, self.scheduler.requests)
        self.step_start = cost_model.step_start if follow_recorded else None
        self.trace_dir = Path(trace_dir)
        full_meta = {"source": "sim", **(meta or {}),
                     "cost_model": {"name": cost_model.name, **cost_model.describe()}, "seed": seed}
        full_meta.setdefault("config", {}).update(
            {"scheduler": scheduler_config.to_dict(), "cache": cache_config.to_dict()})
        self.writer = TraceWriter(self.trace_dir, full_meta, flush_every, overwrite=overwrite)
        # A snapshot lists every held or cached block, up to the whole pool: space them out in proportion
        # to the pool so they add at most half a row per step (the engine's 1024 is for small pools).
        every = snapshot_every or max(1024, 2 * cache_config.num_gpu_blocks)
        self.recorder = TraceRecorder(self.writer, self.scheduler, snapshot_every=every, trace_level=trace_level)
        self.cycle_recorder = CycleRecorder(self.recorder)
        self.cycle = StepCycle(self.scheduler, self.runner, self.clock, self.cycle_recorder,
                               batch_queue_size=2 if scheduler_config.async_scheduling else 1)
        self.num_added = 0
        # Decode-only stretches advance as runs (same decisions, see sim.core.decode_runs), where the loop is
        # synchronous and free to choose step starts; a recorded replay follows the recording step by step.
        # How the engine takes in arrivals when idle (calibrated profiles measure it); not in recorded replays.
        self.intake = cost_model.intake if self.step_start is None else None
        self._use_decode_runs = decode_runs and self.step_start is None and self.cycle.batch_queue_size == 1
        self.decode_runs: DecodeRuns | None = None  # built by the loop, on the recorder it then has

    def clock(self) -> float:
        return self.now

    def add_request(self, r: SimRequest) -> Request:
        """Add a request as the engine does (see `make_request`), at the current simulated time."""
        req = make_request(r)
        self.runner.register(r.request_id, r.output_token_ids)
        self.cycle.add_request(req)
        if req.is_finished():
            self.runner.forget(r.request_id)
        self.num_added += 1
        return req

    def _finish_external(self, items: list[tuple[str, str]]) -> None:
        """Aborts and stop strings recorded between steps: end them as the engine's frontend did."""
        by_status: dict[RequestStatus, list[str]] = {}
        for rid, reason in items:
            by_status.setdefault(_FINISH_STATUS.get(reason, RequestStatus.FINISHED_ABORTED), []).append(rid)
        for status, rids in by_status.items():
            self.recorder.on_abort(self.scheduler.finish_requests(rids, status))
            for rid in rids:
                self.runner.forget(rid)

    def run(self, requests: Iterable[SimRequest], external_finishes: dict[int, list[tuple[str, str]]] | None = None,
            total: int | None = None, progress: bool = False) -> SimResult:
        from tqdm import tqdm

        wall0 = time.perf_counter()
        bar = tqdm(total=total, desc="sim", unit="req", disable=not progress, dynamic_ncols=True, mininterval=0.5)
        interrupted = False
        with fewer_collections():
            try:
                if self.cycle.batch_queue_size > 1:
                    self._loop_async(iter(requests), external_finishes or {}, bar)
                else:
                    self._loop(iter(requests), external_finishes or {}, bar)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                bar.close()
            wall = time.perf_counter() - wall0
            self.recorder.close(sim_time=self.now, wall_time=wall, interrupted=interrupted)
        return SimResult(trace_dir=self.trace_dir, num_steps=self.recorder.step, num_requests=self.num_added,
                         sim_time=self.now, wall_time=wall, interrupted=interrupted)

    def _loop(self, stream: Iterator[SimRequest], external: dict[int, list[tuple[str, str]]], bar: Any) -> None:
        cycle, sched, cost, recorder = self.cycle, self.scheduler, self.cost_model, self.cycle_recorder
        step_start = self.step_start
        add = self.add_request
        runs = self.decode_runs = (DecodeRuns(sched, self.runner, self.recorder, self.cost_model)
                                   if self._use_decode_runs else None)
        intake = self.intake
        per_request = intake.per_request_s if intake is not None else 0.0
        woke, cold = False, 0.0
        nxt = next(stream, None)
        step = 0
        while True:
            if external and step in external:
                self._finish_external(external.pop(step))
            start = self.now
            if step_start is not None:
                hinted = step_start(step)
                if hinted is not None and hinted > start:
                    start = hinted
            due = start  # what has arrived by now is added; what arrives while adding waits a step
            while nxt is not None and nxt.add_time <= due:
                if nxt.add_time > self.now:
                    self.now = nxt.add_time
                if add(nxt).is_finished():  # rejected: done, though never in finished_req_ids
                    bar.update(1)
                nxt = next(stream, None)
                if woke:  # each add after an idle wake-up delays the step (sim.cost_models.intake)
                    self.now = start = start + per_request
            woke = False
            if cold:  # the run's first add is cold: what arrives meanwhile waits a step (sim.cost_models.intake)
                start, cold = start + cold, 0.0
            self.now = start
            if not (sched.running or cycle.has_work()):  # anything running is work: skip the queue checks
                if nxt is None:
                    return
                self.now = max(start, nxt.add_time)
                if intake is not None:
                    look, cold = intake.wake()
                    self.now += look
                    woke = True
                continue
            if runs is not None and runs.ready():
                most = MAX_RUN if not external else min(MAX_RUN, min((s for s in external if s > step),
                                                                     default=step + MAX_RUN) - step)
                done, self.now = runs.advance(start, step, None if nxt is None else nxt.add_time, most)
                if done:
                    step += done
                    cycle.count_decode_run(done)
                    continue
            self.now = start + launch(cycle, cost, step, recorder)[1].total
            so, outputs = cycle.finish()
            step += 1
            # Synchronously, the scheduler's finished ids are exactly this step's finishes (the next
            # schedule() hands them on): no walk over every output to find the few that ended.
            if sched.finished_req_ids:
                self._forget(sched.finished_req_ids, bar)
            if cycle.did_nothing(so, outputs):
                self._stalled(nxt, step_start is not None and step_start(step) is not None)

    def _loop_async(self, stream: Iterator[SimRequest], external: dict[int, list[tuple[str, str]]],
                    bar: Any) -> None:
        """Async scheduling on the simulated clock, in vLLM's batch-queue order: the next step is scheduled
        as soon as the one before it is launched (host time hidden behind device time, as the engine
        hides it), runs on the device when that one ends, and its outputs apply at its own end. A recorded
        replay schedules each step no earlier than it was recorded, so the same arrivals are in before it;
        external finishes apply after the step they followed."""
        cycle, cost, recorder = self.cycle, self.cost_model, self.cycle_recorder
        step_start = self.step_start
        add = self.add_request
        ends: deque[float] = deque()
        device_free = 0.0
        launched = 0
        cold = 0.0
        nxt = next(stream, None)
        while True:
            if external and cycle.num_steps in external:
                self._finish_external(external.pop(cycle.num_steps))
            if step_start is not None and (hinted := step_start(launched)) is not None and hinted > self.now:
                if cycle.has_work() or (nxt is not None and nxt.add_time <= hinted):
                    self.now = hinted
            while nxt is not None and nxt.add_time <= self.now:
                add(nxt)
                nxt = next(stream, None)
            self.now, cold = self.now + cold, 0.0
            if cycle.has_work():
                so, timing = launch(cycle, cost, launched, recorder)
                device_free = max(self.now, device_free) + timing.total
                launched += 1
                ends.append(device_free)
                if cycle.may_schedule_ahead(so):
                    continue
            elif not cycle.in_flight:
                if nxt is None:
                    return
                self.now = max(self.now, nxt.add_time)
                if self.intake is not None:
                    look, cold = self.intake.wake()
                    self.now += look
                continue
            self.now = max(self.now, ends.popleft())
            so, outputs = cycle.finish()
            self._finished(outputs, bar)
            if cycle.has_work() and cycle.did_nothing(so, outputs):
                self._stalled(nxt, False)

    def _finished(self, outputs: EngineCoreOutputs, bar: Any) -> None:
        """Let the fake runner forget the requests that ended in this step."""
        done = 0
        for out in outputs.outputs:
            if out.finish_reason is not None:
                self.runner.forget(out.request_id)
                done += 1
        if done:
            bar.update(done)

    def _forget(self, request_ids: set[str], bar: Any) -> None:
        for rid in request_ids:
            self.runner.forget(rid)
        bar.update(len(request_ids))

    def _stalled(self, nxt: SimRequest | None, recorded_ahead: bool) -> None:
        """Nothing ran and nothing can until the next arrival: jump to it, or give up if there is none."""
        if recorded_ahead:
            return
        if nxt is None:
            raise SimulationError(f"scheduler stalled at step {self.recorder.step}: {len(self.scheduler.waiting)} "
                                  "waiting request(s) can never be scheduled with this KV cache")
        self.now = max(self.now, nxt.add_time)
