"""Decode runs for a cluster's replicas (sim.core.decode_runs): a decode-only stretch of one replica advances
as one event of the cluster's loop instead of one event per step, with the same decisions and times.

Replicas touch one another only through the router and the SLO watch (the cost model they share times
a step by its batch and step index, whatever order it is asked in):

- The router reads the replicas when a request arrives, so a run stops before the first step that starts
  at or after the next arrival anywhere in the cluster. What the router reads of a replica in the middle
  of a run's last step is what it reads step by step: decode steps add and free no request, and a step
  takes its blocks (and caches its prefix blocks) when it is scheduled, as the run takes them.
- The watch may stop the whole cluster at a request that ends on another replica, in the middle of a
  run. `ReplicaRuns.rewind` then takes back the run's steps that end after the stop
  (`engine.core.decode_run.rewind_decode_steps`): the tokens they appended and their count, which is
  what the results read; the blocks they took stay held, since the stopped cluster steps no further.

A cluster of several replicas takes runs only where it writes no trace (what `sim plan`'s searches run): its
trace numbers steps cluster-wide in the order they end, and a run's steps interleave with other replicas'
steps. A single replica's trace numbers its own steps, and its runs record into it.
"""
from __future__ import annotations

from bisect import bisect_right

from engine.core.decode_run import rewind_decode_steps
from engine.core.scheduler import Scheduler
from sim.cost_models.base import CostModel
from sim.core.decode_runs import MAX_RUN, DecodeRuns
from sim.core.runner import FakeModelRunner
from traces.recorder import TraceRecorder


class RunLog:
    """The recorder a replica's DecodeRuns writes to without a trace: keeps the last run's requests and
    step ends, all that a rewind needs."""

    snapshot_every = 1 << 62  # no block snapshots without a trace

    def __init__(self) -> None:
        self.rids: list[str] = []
        self.ends: list[float] = []

    def is_between_steps(self) -> bool:
        return True

    def on_decode_step_blocks(self, step: int) -> None:
        pass

    def on_decode_run(self, rids: list[str], computed0: list[int], starts: list[float], ends: list[float],
                      phases: tuple[list[float], list[float], list[float]], used: list[int],
                      gained: dict[int, list[int]], num_waiting: int,
                      admission_stop: tuple[str, str, int, int] | None) -> None:
        self.rids, self.ends = rids, ends


class ReplicaRuns:
    """One replica's decode runs: `advance` where its scheduler is ready for one, `rewind` at a stop.
    Runs record into the replica's trace where it writes one, else into a `RunLog`, which a rewind reads."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner, cost_model: CostModel,
                 recorder: TraceRecorder | None = None) -> None:
        self.log = RunLog() if recorder is None else None
        self.runs = DecodeRuns(scheduler, runner, recorder or self.log, cost_model)
        self.requests = scheduler.requests

    def advance(self, now: float, step: int, next_arrival: float | None, max_steps: int = MAX_RUN) -> tuple[int, float]:
        """A run from `now` (the replica's step `step`) up to the next arrival; (0, now) where the replica
        is not in a decode-only stretch."""
        if not self.runs.ready():
            return 0, now
        return self.runs.advance(now, step, next_arrival, max_steps)

    def rewind(self, t: float) -> int:
        """Take back the last run's steps that end after `t` from its requests; returns how many (a run
        recorded into a trace is not taken back: a traced run is never stopped by a watch)."""
        if self.log is None:
            return 0
        ends = self.log.ends
        k = len(ends) - bisect_right(ends, t)
        if k:
            rewind_decode_steps((self.requests[rid] for rid in self.log.rids), k)
            self.log.ends = ends[:-k]
        return k
