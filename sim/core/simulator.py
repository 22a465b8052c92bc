"""`sim replay`'s simulator: one engine replica on a simulated clock, i.e. a one-replica `Cluster`.

Two kinds of events move the clock: a request arriving (it is added to the scheduler at the start of the
next step) and a step completing (the step started when the previous one ended, or at the next arrival if
the engine was idle, and lasts what the cost model says for the batch the scheduler produced). The
scheduler, KV cache manager and block pool are `engine.core`'s own, with `clock` reading the simulated
time, and every step is recorded through `traces.recorder.TraceRecorder`, so the trace is the engine's
format.

Recorded replays (`follow_recorded`, the `recorded` cost model) follow the engine's clock exactly: each
request is added at its recorded `queued` time (when the engine's scheduler saw it, which decides the step
it can first be scheduled in) and step i starts at the recorded start of step i, not merely after the
previous step's duration, since the engine's loop spends time between steps too.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.cluster import Cluster
from sim.core.sources import SimRequest
from sim.cost_models.base import CostModel


@dataclass(slots=True, kw_only=True)
class SimResult:
    trace_dir: Path | None
    num_steps: int
    num_requests: int
    sim_time: float
    wall_time: float
    interrupted: bool


class Simulator:
    """Build once per run; `run(requests)` drives the scheduler to completion and closes the trace."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, cost_model: CostModel,
                 trace_dir: str | Path, meta: dict[str, Any] | None = None, seed: int = 0,
                 vocab_size: int = 32000, follow_recorded: bool = False, snapshot_every: int | None = None, flush_every: int = 1024,
                 trace_level: str = "full", decode_runs: bool = True, overwrite: bool = False,
                 data_parallel_size: int = 1, enforce_eager: bool = False, vllm_version: str | None = None) -> None:
        self.cluster = Cluster(1, scheduler_config, cache_config, cost_model, trace_dir=trace_dir, meta=meta, seed=seed,
                               vocab_size=vocab_size, trace_level=trace_level, decode_runs=decode_runs,
                               overwrite=overwrite, follow_recorded=follow_recorded, snapshot_every=snapshot_every,
                               flush_every=flush_every, keep_requests=False, data_parallel_size=data_parallel_size,
                               enforce_eager=enforce_eager, vllm_version=vllm_version)
        self.replica = self.cluster.replicas[0]

    def run(self, requests: Iterable[SimRequest], external_finishes: dict[int, list[tuple[str, str]]] | None = None,
            total: int | None = None, progress: bool = False) -> SimResult:
        result = self.cluster.run(requests, external_finishes=external_finishes, total=total, progress=progress)
        return SimResult(trace_dir=result.trace_dir, num_steps=result.num_steps, num_requests=result.num_requests,
                         sim_time=result.sim_time, wall_time=result.wall_time, interrupted=result.interrupted)
