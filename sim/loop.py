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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from sim.batch import batch_from_output
from sim.cost_models.base import CostModel
from sim.runner import FakeModelRunner
from sim.sources import SimRequest, make_request
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED}
@contextmanager
def _fewer_collections(threshold: int = 100_000):
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
                 snapshot_every: int | None = None) -> None:
        self.now = 0.0
        self.cost_model = cost_model
        self.scheduler = Scheduler(scheduler_config, cache_config, clock=lambda: self.now)
        self.runner = FakeModelRunner(seed, vocab_size)
        self.step_start = getattr(cost_model, "step_start", None) if follow_recorded else None
        self.trace_dir = Path(trace_dir)
        full_meta = {"source": "sim", **(meta or {}),
                     "cost_model": {"name": cost_model.name, **cost_model.describe()}, "seed": seed}
        full_meta.setdefault("config", {}).update(
            {"scheduler": scheduler_config.to_dict(), "cache": cache_config.to_dict()})
        self.writer = TraceWriter(self.trace_dir, full_meta, flush_every)
        # A snapshot lists every held or cached block, up to the whole pool: space them out in proportion
        # to the pool so they add at most half a row per step (the engine's 1024 is for small pools).
        every = snapshot_every or max(1024, 2 * cache_config.num_gpu_blocks)
        self.recorder = TraceRecorder(self.writer, self.scheduler, snapshot_every=every)
        self.num_added = 0

    def add_request(self, r: SimRequest) -> Request:
        """Add a request as the engine does (see `make_request`), at the current simulated time."""
        req = make_request(r)
        self.runner.register(r.request_id, r.output_token_ids)
        self.scheduler.add_request(req)
        self.recorder.on_add(req)
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
        with _fewer_collections():
            try:
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
        sched, runner, recorder, cost = self.scheduler, self.runner, self.recorder, self.cost_model
        step_time, step_start, execute = cost.step_time, self.step_start, runner.execute
        schedule, update = sched.schedule, sched.update_from_output
        add, forget = self.add_request, runner.forget
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
            while nxt is not None and nxt.add_time <= start:
                if nxt.add_time > self.now:
                    self.now = nxt.add_time
                add(nxt)
                nxt = next(stream, None)
            self.now = start
            if not (sched.running or sched.waiting or sched.has_pending_outputs()):
                if nxt is None:
                    return
                self.now = max(start, nxt.add_time)
                continue
            so = schedule()
            duration = step_time(batch_from_output(so), step)
            runner_output = execute(so, sched.requests)
            self.now = end = start + duration
            outputs = update(so, runner_output)
            recorder.on_step(so, outputs, start, end, 0.0, duration, 0.0)
            step += 1
            done = 0
            for out in outputs.outputs:
                if out.finish_reason is not None:
                    forget(out.request_id)
                    done += 1
            if done:
                bar.update(done)
            elif not (so.total_num_scheduled_tokens or sched.running or outputs.outputs or so.preempted_req_ids):
                self._stalled(nxt, step_start is not None and step_start(step) is not None)

    def _stalled(self, nxt: SimRequest | None, recorded_ahead: bool) -> None:
        """Nothing ran and nothing can until the next arrival: jump to it, or give up if there is none."""
        if recorded_ahead:
            return
        if nxt is None:
            raise SimulationError(f"scheduler stalled at step {self.recorder.step}: {len(self.scheduler.waiting)} "
                                  "waiting request(s) can never be scheduled with this KV cache")
        self.now = max(self.now, nxt.add_time)
