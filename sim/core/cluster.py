"""N replicas behind a router on one simulated clock.

Each replica is the single-replica simulator's parts: an `engine.core.Scheduler` (with its own KV cache
manager and block pool), a `FakeModelRunner` and the shared cost model. One global discrete-event loop
moves the clock: the next event is either an arrival (routed at once, on the replicas' state at that
time) or the end of some replica's step (`update_from_output` runs then, so finishes and freed blocks
appear at the step's end). A replica adds what was routed to it at the start of its next step, exactly
as the single-replica loop adds arrivals, so a one-replica cluster reproduces `Simulator` to the bit.
Without a trace, a replica's decode-only stretches advance as runs (sim.core.cluster_runs), one event each.

Trace (optional): one directory for the whole cluster, the usual tables plus a `replica` column on
every row. `step` numbers are cluster-wide (unique, in the order steps ended), so `steps` joins
`decisions` as in a one-replica trace; block ids are per replica (filter on `replica` before rebuilding
a block pool). `meta.json` gets a `cluster` entry: replicas, router, per-replica KV blocks. Without a
trace directory the loop records nothing and the metrics come straight from the scheduler's requests.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from engine.core.async_scheduler import make_scheduler
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.request import Request
from engine.core.step_cycle import StepCycle
from sim.core.cluster_runs import ReplicaRuns
from sim.cost_models.base import CostModel
from sim.core.loop import CycleRecorder, SimulationError, fewer_collections, launch
from sim.core.routers import Router, make_router
from sim.core.runner import FakeModelRunner
from sim.core.sources import SimRequest, make_request
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter

REPLICA_COLUMN = "replica"
REQUEST_METRIC_COLUMNS = ("request_id", "arrival", "queued", "first_scheduled", "first_token", "finish",
                          "num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "num_preemptions",
                          "finish_reason", "error", REPLICA_COLUMN)


class _ReplicaWriter:
    """The writer a replica's TraceRecorder sees: stamps `replica` on each row, shares one directory.

    The recorder appends straight to the shared writer's buffers (no dict per row); the replica column,
    which the recorder does not know, is stamped on those rows after each of this replica's steps."""

    _STAMPED = ("decisions", "block_events", "steps")

    def __init__(self, writer: TraceWriter, index: int) -> None:
        self.writer, self.index = writer, index

    def buffer(self, table: str) -> dict[str, list[Any]]:
        return self.writer.buffer(table)

    def row_buffer(self, table: str) -> list[tuple]:
        return self.writer.row_buffer(table)

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            row[REPLICA_COLUMN] = self.index
        self.writer.write_rows(table, rows)

    def _stamp(self) -> None:
        """Every row appended since the last stamp is this replica's: one replica records at a time."""
        w = self.writer
        for table in self._STAMPED:
            cols = w.buffer(table)
            stamp = cols[REPLICA_COLUMN]
            missing = len(cols["step"]) + len(w.row_buffer(table)) - len(stamp)
            if missing > 0:
                stamp.extend([self.index] * missing)

    def flush(self) -> None:
        self._stamp()
        self.writer.flush()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        """The cluster closes the shared writer once, after every replica; the rows this replica's
        recorder wrote at its close still get their stamp."""
        self._stamp()


class RunWatch(Protocol):
    """What may stop a run once its verdict is known: told of each request as it ends, and asked about
    the ones still in flight every `interval` simulated seconds (None: never)."""

    interval: float | None

    def ended(self, req: Request) -> bool: ...

    def in_flight(self, now: float, requests: Iterable[Request]) -> bool: ...


class Replica:
    """One engine replica: its scheduler, runner, inbox of routed requests and the step in flight."""

    def __init__(self, index: int, cluster: Cluster, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, seed: int, vocab_size: int) -> None:
        self.index = index
        self.cluster = cluster
        self.scheduler = make_scheduler(scheduler_config, cache_config, clock=cluster.clock)
        self.runner = FakeModelRunner(seed, vocab_size, self.scheduler.requests)
        self.cycle = StepCycle(self.scheduler, self.runner, cluster.clock,
                               batch_queue_size=2 if scheduler_config.async_scheduling else 1)
        self.ends: deque[float] = deque()  # async scheduling: when each step in flight ends on the device
        self.device_free = 0.0
        self.num_launched = 0
        self.pool_map = self.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
        self.inbox: list[tuple[Request, SimRequest]] = []
        self.added: list[Request] = []
        self.live: dict[str, Request] = {}
        self.recorder: TraceRecorder | None = None
        self.cycle_recorder: CycleRecorder | None = None
        self.runs: ReplicaRuns | None = None  # decode runs, where the cluster writes no trace
        self.busy = False
        self.in_run = False
        self.stalled = False
        self.num_steps = 0

    # ---- what a router reads ----
    @property
    def num_outstanding(self) -> int:
        s = self.scheduler
        return len(self.inbox) + len(s.running) + len(s.waiting)

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_cache_manager.usage

    def cached_prefix_blocks(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt this replica's prefix cache holds."""
        table, n = self.pool_map, 0
        for h in block_hashes:
            if h not in table:
                break
            n += 1
        return n

    # ---- the step cycle ----
    def has_work(self) -> bool:
        s = self.scheduler
        return bool(self.inbox) or bool(s.running) or bool(s.waiting) or s.has_pending_outputs()

    def start_step(self, now: float, next_arrival: float | None = None) -> float | None:
        """Add the inbox, schedule one step (or a decode run up to `next_arrival`, see sim.core.cluster_runs) and
        launch it; returns when it ends (None: idle)."""
        cycle, runner, cluster = self.cycle, self.runner, self.cluster
        for req, sim_req in self.inbox:
            runner.register(req.request_id, sim_req.output_token_ids)
            cycle.add_request(req)
            if req.is_finished():
                runner.forget(req.request_id)
            self.added.append(req)
            if cluster.watch is not None:
                if req.is_finished():
                    cluster.stopped |= cluster.watch.ended(req)
                else:
                    self.live[req.request_id] = req
        self.inbox.clear()
        if cycle.batch_queue_size > 1:
            return self._launch(now)
        if not (self.scheduler.running or cycle.has_work()):
            return None
        self.busy = True
        if self.runs is not None:
            done, end = self.runs.advance(now, self.num_steps, next_arrival)
            if done:
                self.in_run = True
                self.num_steps += done
                cycle.count_decode_run(done)
                cluster.num_steps += done
                return end
        return now + launch(cycle, cluster.cost_model, self.num_steps, self.cycle_recorder)[1].total

    def _launch(self, now: float) -> float | None:
        """Async scheduling, in the order of `sim.core.loop.Simulator._loop_async` (vLLM's batch queue): schedule
        while the queue has room and there is work, each step running on the device once the one before it
        ends; returns when the oldest step in flight ends (None: idle)."""
        cycle = self.cycle
        while cycle.has_work() and len(cycle.in_flight) < cycle.batch_queue_size:
            so, timing = launch(cycle, self.cluster.cost_model, self.num_launched, self.cycle_recorder)
            self.device_free = max(now, self.device_free) + timing.total
            self.num_launched += 1
            self.ends.append(self.device_free)
            if not cycle.may_schedule_ahead(so):
                break
        if not self.ends:
            return None
        self.busy = True
        return self.ends[0]

    def finish_step(self) -> None:
        """The step's end: apply its outputs, record it, and notice a replica that can never progress."""
        self.busy = False
        if self.in_run:  # a run's steps were applied as it began
            self.in_run = False
            return
        if self.ends:
            self.ends.popleft()
        if self.recorder is not None:
            self.recorder.step = self.cluster.num_steps
        so, outputs = self.cycle.finish()
        self.cluster.num_steps += 1
        self.num_steps += 1
        forget, watch = self.runner.forget, self.cluster.watch
        for out in outputs.outputs:
            if out.finish_reason is not None:
                forget(out.request_id)
                req = self.live.pop(out.request_id, None)  # a rejected request was watched when added
                if watch is not None and req is not None and watch.ended(req):
                    self.cluster.stopped = True
        if self.cycle.did_nothing(so, outputs) and not self.cycle.in_flight:
            self.stalled = True


@dataclass(slots=True, kw_only=True)
class ClusterResult:
    requests: pd.DataFrame
    num_steps: int
    sim_time: float
    trace_dir: Path | None
    stopped: bool = False


class Cluster:
    """Build once per run; `run(requests)` routes and simulates every request to completion."""

    def __init__(self, num_replicas: int, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 cost_model: CostModel, router: Router | str = "round_robin", trace_dir: str | Path | None = None,
                 meta: dict[str, Any] | None = None, seed: int = 0, vocab_size: int = 32000,
                 trace_level: str = "full", decode_runs: bool = True, overwrite: bool = False) -> None:
        if num_replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {num_replicas}")
        self.now = 0.0
        self.num_steps = 0
        self.watch: RunWatch | None = None
        self.stopped = False
        self.cost_model = cost_model
        self.router = make_router(router, seed) if isinstance(router, str) else router
        self.block_size = cache_config.block_size if cache_config.enable_prefix_caching else None
        self.replicas = [Replica(i, self, scheduler_config, cache_config, seed, vocab_size)
                         for i in range(num_replicas)]
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.writer: TraceWriter | None = None
        if self.trace_dir is not None:
            full = {"source": "sim", **(meta or {}), "cost_model": {"name": cost_model.name, **cost_model.describe()},
                    "seed": seed, "trace_level": trace_level,
                    "cluster": {"replicas": num_replicas, "router": self.router.name, "replica_column": REPLICA_COLUMN,
                                "kv_blocks_per_replica": cache_config.num_gpu_blocks}}
            full.setdefault("config", {}).update(
                {"scheduler": scheduler_config.to_dict(), "cache": cache_config.to_dict()})
            self.writer = TraceWriter(self.trace_dir, full, flush_every=1024, extra_int_columns=(REPLICA_COLUMN,),
                                      overwrite=overwrite)
            for r in self.replicas:
                # Cluster-wide step numbers would make per-replica snapshots land at random steps: keep only step 0's.
                r.recorder = TraceRecorder(_ReplicaWriter(self.writer, r.index), r.scheduler,
                                           snapshot_every=1 << 62, trace_level=trace_level)
                r.cycle.recorder = r.cycle_recorder = CycleRecorder(r.recorder)
        elif decode_runs and not scheduler_config.async_scheduling:
            for r in self.replicas:
                r.runs = ReplicaRuns(r.scheduler, r.runner, cost_model)

    def clock(self) -> float:
        return self.now

    def run(self, requests: Iterable[SimRequest], watch: RunWatch | None = None) -> ClusterResult:
        """`watch` sees every request as it ends (finished, rejected) and, every `watch.interval` simulated
        seconds, those still in flight; once it answers True the run stops there (a search that already
        knows the verdict), leaving later requests unfinished."""
        self.watch = watch
        with fewer_collections():
            try:
                self._loop(iter(requests))
            finally:
                if self.writer is not None:
                    for r in self.replicas:
                        r.recorder.close()
                    self.writer.close(num_steps=self.num_steps, sim_time=self.now)
        return ClusterResult(requests=self.request_table(), num_steps=self.num_steps, sim_time=self.now,
                             trace_dir=self.trace_dir, stopped=self.stopped)

    def _loop(self, stream: Iterable[SimRequest]) -> None:
        replicas, route, block_size = self.replicas, self.router.route, self.block_size
        events: list[tuple[float, int]] = []
        nxt = next(stream, None)
        inf = math.inf
        watch = self.watch
        interval = watch.interval if watch is not None else None
        next_look = interval if interval is not None else inf
        while True:
            t_arrival = nxt.add_time if nxt is not None else inf
            t_end = events[0][0] if events else inf
            t = t_arrival if t_arrival < t_end else t_end
            if self.stopped:  # the steps of runs that end after now had not ended step by step: take them back
                self.num_steps -= sum(r.runs.rewind(self.now) for r in replicas if r.runs is not None)
                return
            if t == inf:
                break
            if next_look <= t:  # the watch's look at requests in flight, on its own clock: runs or not, the same
                self.now = next_look
                self.stopped |= watch.in_flight(next_look, (q for r in replicas for q in r.live.values()))
                next_look += interval
                continue
            self.now = t
            touched: list[Replica] = []
            # Step ends first: a request arriving exactly then is added to that replica's next step.
            while events and events[0][0] <= t:
                r = replicas[heapq.heappop(events)[1]]
                r.finish_step()
                touched.append(r)
            while nxt is not None and nxt.add_time <= t:
                req = make_request(nxt, block_size)
                r = replicas[route(req, replicas)]
                r.inbox.append((req, nxt))
                r.stalled = False
                touched.append(r)
                nxt = next(stream, None)
            for r in touched:
                if not r.busy and not r.stalled:
                    end = r.start_step(t, nxt.add_time if nxt is not None else None)
                    if end is not None:
                        heapq.heappush(events, (end, r.index))

        stuck = [r for r in replicas if r.scheduler.waiting or r.scheduler.running]
        if stuck:
            r = stuck[0]
            raise SimulationError(f"replica {r.index} stalled at {self.now:.3f} s: {len(r.scheduler.waiting)} waiting "
                                  "request(s) can never be scheduled with this KV cache")

    def request_table(self) -> pd.DataFrame:
        """One row per request, the trace's `requests` columns that metrics need plus `replica`."""
        rows = []
        for r in self.replicas:
            for q in r.added:
                rows.append((q.request_id, q.arrival_time, q.queued_time, q.first_scheduled_time, q.first_token_time,
                             q.finished_time, q.num_prompt_tokens, q.num_output_tokens, max(q.num_cached_tokens, 0),
                             q.num_preemptions, q.get_finish_reason(), q.error, r.index))
        return pd.DataFrame(rows, columns=list(REQUEST_METRIC_COLUMNS))


def replica_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-replica and cluster-wide headline metrics (one row each, `replica` = 'all' for the cluster)."""
    from traces.summary import summarize

    keys = ("requests", "finished", "output_tokens", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "prefix_hit_rate",
            "preemptions")
    rows = []
    groups = [(str(i), g) for i, g in requests.groupby(REPLICA_COLUMN)] + [("all", requests)]
    for name, g in groups:
        s = summarize(g)
        rows.append({REPLICA_COLUMN: name, **{k: s[k] for k in keys}})
    return pd.DataFrame(rows)
