"""The simulator's one loop: N engine replicas (sim.core.replica) behind a router on one simulated clock.

Each replica is an engine's parts: an `engine.core.Scheduler` (with its own KV cache manager and block
pool), a `FakeModelRunner` and the shared cost model, driven by its step policy. One discrete-event loop
moves the clock: the next event is either an arrival (routed at once, on the replicas' state at that
time) or a time some replica waits for (a step's end: `update_from_output` runs then, so finishes and
freed blocks appear at the step's end; or a recorded step start, an idle engine's wake-up). A replica
adds what was routed to it at the start of its next step, as the engine adds arrivals. `sim replay` is
this loop with one replica (sim.core.simulator). Decode-only stretches advance as runs
(sim.core.decode_runs), one event each.

Trace (optional). One replica writes the engine's format. Several write one directory for the whole
cluster, the usual tables plus a `replica` column on every row: `step` numbers are cluster-wide (unique,
in the order steps ended), so `steps` joins `decisions` as in a one-replica trace; block ids are per
replica (filter on `replica` before rebuilding a block pool); `meta.json` gets a `cluster` entry:
replicas, router, per-replica KV blocks. Without a trace directory the loop records nothing and the
metrics come straight from the scheduler's requests.
"""
from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCost, StepTimes
from sim.core.headroom import Headroom, HeadroomReport
from sim.core.data_parallel import DataParallelEngine, cuda_graph_tokens
from sim.core.replica import Engine, Replica
from sim.core.routers import Router, make_router
from sim.core.sources import SimRequest, make_request
from sim.core.stepping import SimulationError, fewer_collections
from sim.cost_models.base import CostModel
from traces.recorder import TraceRecorder
from traces.runs import GridSpec, RunEntry, RunSpec
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
    columnar = True

    def __init__(self, writer: TraceWriter, index: int) -> None:
        self.writer, self.index = writer, index

    def buffer(self, table: str) -> dict[str, list[Any]]:
        return self.writer.buffer(table)

    def row_buffer(self, table: str) -> list[tuple[object, ...]]:
        return self.writer.row_buffer(table)

    def run_buffer(self, table: str, spec: RunSpec | GridSpec) -> list[RunEntry] | None:
        """None: a run's rows would carry no replica stamp, so the recorder appends them row by row."""
        return None

    def update_meta(self, **fields: Any) -> None:
        self.writer.update_meta(**fields)

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

    def flush(self, steps: int = 1) -> None:
        self._stamp()
        self.writer.flush(steps)

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        """The cluster closes the shared writer once, after every replica; the rows this replica's
        recorder wrote at its close still get their stamp."""
        self._stamp()


class _NumberedAcross:
    """A replica's recorder in a trace of several replicas: its steps are numbered cluster-wide, in the
    order they end (the steps every replica finished before)."""

    def __init__(self, recorder: TraceRecorder[Request], cluster: Cluster) -> None:
        self.recorder, self.cluster = recorder, cluster

    def on_add(self, request: Request) -> None:
        self.recorder.on_add(request)

    def on_abort(self, freed: dict[str, list[int]]) -> list[Request]:
        return self.recorder.on_abort(freed)

    def on_step(self, step: int, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes,
                cost: StepCost | None = None) -> list[Request]:
        return self.recorder.on_step(self.cluster.num_steps, so, outputs, times, cost)


class RunWatch(Protocol):
    """What may stop a run once its verdict is known: told of each request as it ends, and asked about
    the ones still in flight every `interval` simulated seconds (None: never)."""

    interval: float | None

    def ended(self, req: Request) -> bool: ...

    def in_flight(self, now: float, requests: Iterable[Request]) -> bool: ...


@dataclass(slots=True, kw_only=True)
class ClusterResult:
    requests: pd.DataFrame | None
    num_steps: int
    sim_time: float
    trace_dir: Path | None
    stopped: bool = False
    num_requests: int = 0
    wall_time: float = 0.0
    interrupted: bool = False
    headroom: HeadroomReport | None = None


class Cluster:
    """Build once per run; `run(requests)` routes and simulates every request to completion.

    One replica writes the single-engine trace (its own step numbers and block snapshots, no `replica`
    column), so a replay and a one-replica plan are the same run. `follow_recorded` makes a recorded
    replay follow the recording's step starts (one replica only)."""

    def __init__(self, num_replicas: int, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 cost_model: CostModel, router: Router | str = "round_robin", trace_dir: str | Path | None = None,
                 meta: dict[str, Any] | None = None, seed: int = 0, vocab_size: int = 32000,
                 trace_level: str = "full", decode_runs: bool = True, overwrite: bool = False,
                 follow_recorded: bool = False, snapshot_every: int | None = None, flush_every: int = 1024,
                 keep_requests: bool = True, headroom_block_sizes: tuple[int, ...] | None = None,
                 data_parallel_size: int = 1, enforce_eager: bool = False, vllm_version: str | None = None) -> None:
        if num_replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {num_replicas}")
        if data_parallel_size < 1:
            raise ValueError(f"--data-parallel-size: must be >= 1, got {data_parallel_size}")
        if follow_recorded and num_replicas * data_parallel_size > 1:
            raise ValueError("a recorded replay follows one engine's steps: it runs on one replica")
        self.now = 0.0
        self.num_added = 0
        self.next_arrival: float | None = None
        self.watch: RunWatch | None = None
        self.stopped = False
        self._bar: Any = None
        self.cost_model = cost_model
        self.router = make_router(router, seed) if isinstance(router, str) else router
        self.block_size = cache_config.block_size if cache_config.enable_prefix_caching else None
        step_start = cost_model.step_start if follow_recorded else None
        # How the engine takes in arrivals when idle (calibrated profiles measure it); not in recorded replays.
        intake = cost_model.intake if step_start is None else None
        dp = data_parallel_size
        # Every engine core (a data-parallel rank is one) is a replica: its own scheduler, KV cache and trace rows.
        self.replicas = [Replica(i, self, scheduler_config, cache_config, seed, vocab_size, step_start,
                                 intake if dp == 1 else None, keep_requests) for i in range(num_replicas * dp)]
        # What the router sends requests to: a replica, or the data-parallel engine over `dp` of them.
        self.engines: list[Engine] = list(self.replicas) if dp == 1 else [
            DataParallelEngine(g, self, self.replicas[g * dp:(g + 1) * dp],
                               cuda_graph_tokens(scheduler_config.max_num_seqs, enforce_eager), vllm_version)
            for g in range(num_replicas)]
        if headroom_block_sizes is not None:  # how near the run came to its limits (sim.core.headroom)
            for r in self.replicas:
                r.headroom = Headroom(headroom_block_sizes)
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.writer: TraceWriter | None = None
        # Several replicas number their steps cluster-wide, in the order they end; one numbers its own.
        self.numbers_steps = self.trace_dir is not None and len(self.replicas) > 1
        if self.trace_dir is not None:
            self._open_trace(self.trace_dir, scheduler_config, cache_config, meta, seed, trace_level, overwrite,
                             snapshot_every, flush_every)
        runs = decode_runs and not scheduler_config.async_scheduling and step_start is None and dp == 1
        if runs and not self.numbers_steps:
            for r in self.replicas:
                r.take_runs()

    def _open_trace(self, trace_dir: Path, scheduler_config: SchedulerConfig, cache_config: CacheConfig, meta: dict[str, Any] | None,
                    seed: int, trace_level: str, overwrite: bool, snapshot_every: int | None,
                    flush_every: int) -> None:
        cost_model = self.cost_model
        full = {"source": "sim", **(meta or {}), "cost_model": cost_model.describe().to_meta(),
                "seed": seed}
        full.setdefault("config", {}).update({"scheduler": scheduler_config.to_dict(), "cache": cache_config.to_dict()})
        if not self.numbers_steps:
            self.writer = TraceWriter(trace_dir, full, flush_every=flush_every, overwrite=overwrite)
            # A snapshot lists every held or cached block, up to the whole pool: space them out in proportion
            # to the pool so they add at most half a row per step (the engine's 1024 is for small pools).
            r = self.replicas[0]
            every = snapshot_every or max(1024, 2 * r.scheduler.kv_cache_manager.block_pool.num_blocks)
            r.attach(TraceRecorder[Request](self.writer, r.scheduler, snapshot_every=every, trace_level=trace_level))
            return
        full["cluster"] = {"replicas": len(self.replicas), "router": self.router.name, "replica_column": REPLICA_COLUMN,
                           "kv_blocks_per_replica": cache_config.num_gpu_blocks}
        self.writer = TraceWriter(trace_dir, full, flush_every=flush_every, extra_int_columns=(REPLICA_COLUMN,),
                                  overwrite=overwrite)
        for r in self.replicas:
            # Cluster-wide step numbers would make per-replica snapshots land at random steps: keep only step 0's.
            recorder = TraceRecorder[Request](_ReplicaWriter(self.writer, r.index), r.scheduler, snapshot_every=1 << 62,
                                     trace_level=trace_level)
            r.attach(recorder, _NumberedAcross(recorder, self))

    def clock(self) -> float:
        return self.now

    @property
    def num_steps(self) -> int:
        """Steps taken by every replica (each replica's step cycle counts its own)."""
        return sum(r.cycle.num_steps for r in self.replicas)

    def release(self) -> None:
        """Free the run's replicas now (`Replica.release`), its result read: a capacity plan simulates
        hundreds of runs in one process, and left to the garbage collector each run's pools and requests
        cost it passes over everything alive."""
        for e in self.engines:
            e.release()
        self.replicas, self.engines = [], []

    def ended(self, req: Request) -> None:
        """A request ended (finished, rejected): the watch may have its verdict, the progress bar moves."""
        if self.watch is not None and self.watch.ended(req):
            self.stopped = True
        if self._bar is not None:
            self._bar.update(1)

    def run(self, requests: Iterable[SimRequest], watch: RunWatch | None = None,
            external_finishes: dict[int, list[tuple[str, str]]] | None = None, total: int | None = None,
            progress: bool = False) -> ClusterResult:
        """`watch` sees every request as it ends (finished, rejected) and, every `watch.interval` simulated
        seconds, those still in flight; once it answers True the run stops there (a search that already
        knows the verdict), leaving later requests unfinished. `external_finishes` (one replica): aborts
        and stop strings a recorded run applied before the step of that index. Ctrl-C ends the run where
        it is, its trace closed and readable (`interrupted`)."""
        if watch is not None and self.writer is not None:
            raise ValueError("a watched run stops early: it writes no trace")
        if external_finishes and len(self.replicas) > 1:
            raise ValueError("external finishes are one engine's: they apply to one replica")
        self.watch = watch
        if external_finishes:
            self.replicas[0].external.update(external_finishes)
        wall0 = time.perf_counter()
        interrupted = False
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="sim", unit="req", dynamic_ncols=True, mininterval=0.5)
        with fewer_collections():
            try:
                self._loop(iter(requests))
            except KeyboardInterrupt:
                interrupted = True
            finally:
                if self._bar is not None:
                    self._bar.close()
                wall = time.perf_counter() - wall0
                self._close_trace(wall, interrupted)
        return ClusterResult(requests=self.request_table(), num_steps=self.num_steps, sim_time=self.now, trace_dir=self.trace_dir,
                             stopped=self.stopped, num_requests=self.num_added, wall_time=wall, interrupted=interrupted,
                             headroom=self._headroom())

    def _headroom(self) -> HeadroomReport | None:
        watched = [r.headroom for r in self.replicas if r.headroom is not None]
        if not watched:
            return None
        report = HeadroomReport()
        for headroom in watched:
            report.merge(headroom.report)
        return report

    def _close_trace(self, wall: float, interrupted: bool) -> None:
        if self.writer is None:
            return
        recorders = [r.recorder for r in self.replicas if r.recorder is not None]
        if not self.numbers_steps:
            recorders[0].close(sim_time=self.now, wall_time=wall, interrupted=interrupted)
            return
        for recorder in recorders:
            recorder.close()
        self.writer.close(num_steps=self.num_steps, sim_time=self.now, wall_time=wall, interrupted=interrupted)

    def _loop(self, stream: Iterator[SimRequest]) -> None:
        """The one event loop: a replica's step ends first (its outputs applied), then what arrives at
        that instant is routed, then the replicas due then or handed a request go on with their policy."""
        replicas, route, block_size = self.engines, self.router.route, self.block_size
        events: list[tuple[float, int]] = []
        nxt = next(stream, None)
        self.next_arrival = nxt.add_time if nxt is not None else None
        inf = math.inf
        watch = self.watch
        interval = watch.interval if watch is not None else None
        next_look = interval if interval is not None else inf
        for r in replicas:
            self._resume(r, None, events)
        while True:
            t_arrival = nxt.add_time if nxt is not None else inf
            t_end = events[0][0] if events else inf
            t = t_arrival if t_arrival < t_end else t_end
            if self.stopped:  # the steps of runs that end after now had not ended step by step: take them back
                for e in replicas:
                    e.rewind(self.now)
                return
            if t == inf:
                break
            if next_look <= t and watch is not None and interval is not None:  # the watch's look at requests in flight, on its own clock: runs or not, the same
                self.now = next_look
                self.stopped |= watch.in_flight(next_look, (q for r in self.replicas for q in r.live.values()))
                next_look += interval
                continue
            self.now = t
            due: list[Engine] = []
            while events and events[0][0] <= t:
                r = replicas[heapq.heappop(events)[1]]
                if r.stepping:
                    r.finish_step()
                due.append(r)
            while nxt is not None and nxt.add_time <= t:
                req = make_request(nxt, block_size)
                r = replicas[route(req, replicas)]
                r.inbox.append((req, nxt))
                if r.idle:
                    r.idle = False
                    due.append(r)
                nxt = next(stream, None)
            self.next_arrival = nxt.add_time if nxt is not None else None
            for r in due:
                self._resume(r, t, events)

        stuck = [r for r in self.replicas if r.scheduler.waiting or r.scheduler.running]
        if stuck:
            r = stuck[0]
            where = f"replica {r.index} " if len(self.replicas) > 1 else ""
            raise SimulationError(f"{where}stalled at step {r.num_steps} ({r.now:.3f} s): {len(r.scheduler.waiting)} "
                                  "waiting request(s) can never be scheduled with this KV cache")

    def request_table(self) -> pd.DataFrame | None:
        """One row per request, the trace's `requests` columns that metrics need plus `replica` (None where
        the replicas keep no requests: the trace has them)."""
        rows = []
        for r in self.replicas:
            if r.added is None:
                return None
            for q in r.added:
                rows.append((q.request_id, q.arrival_time, q.queued_time, q.first_scheduled_time, q.first_token_time,
                             q.finished_time, q.num_prompt_tokens, q.num_output_tokens, max(q.num_cached_tokens, 0),
                             q.num_preemptions, q.get_finish_reason(), q.error, r.index))
        return pd.DataFrame(rows, columns=list(REQUEST_METRIC_COLUMNS))

    @staticmethod
    def _resume(r: Engine, t: float | None, events: list[tuple[float, int]]) -> None:
        """Let a replica's policy go on at `t` until it waits again: for a time (an event), or for a request."""
        wait = next(r.policy) if t is None else r.policy.send(t)
        if wait is not None:
            heapq.heappush(events, (wait, r.index))


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
