"""Capacity planning's search: for one deployment configuration, the highest request rate it sustains
within the SLOs.

A configuration is a replica count, a router, a model on some hardware, and scheduler/cache flags. A rate
is judged on the deployment's steady state (sim.plan.window): the workload's requests, looped as long as
needed, arrive at that rate; the SLOs are judged over a measurement window after a warm-up, and the rate
holds only if the deployment keeps up over the window. The rate doubles or halves until the verdict
flips, then bisects (geometrically) until `max_rate * (1 + tol)` is a rate that was simulated and failed.
Everything is deterministic, so a configuration's result depends on nothing but its inputs: that is
what lets a sweep run anywhere (sim.plan.sweep) and resume from a results file.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterable

import numpy as np


from sim.core.headroom import HeadroomReport
from sim.cost_models.profile import ResidualTable
from sim.plan.config import PlanConfig
from sim.plan.watch import MissWatch
from sim.plan.window import DEFAULT_WINDOW, Window, offered_requests, served_over_window, window_ids, window_span
from traces.metrics import SLO, evaluate_slos, finished, parse_slo, request_latencies
from sim.core.sources import SimRequest

if TYPE_CHECKING:
    import pandas as pd

    from engine.core.config import CacheConfig, SchedulerConfig
    from sim.cost_models.base import CostModel


@dataclass(slots=True, kw_only=True)
class PlanSpec:
    """What every configuration of one plan shares (plain data: it travels to worker processes)."""

    workload: str
    slo: str
    rate_tol: float = 0.05
    max_requests: int | None = None
    length_scale: float | None = None
    vocab_size: int = 32000
    seed: int = 0
    max_doublings: int = 12
    min_served_ratio: float = 0.95
    window: int = DEFAULT_WINDOW
    lifetime_s: float = 0.0  # a request's life at full load on the plan's slowest configuration (request_lifetime)
    samples: int = 0
    residual_profile: str | None = None
    digests: dict[str, str] = field(default_factory=dict)  # input files' sha256 by name (sim.plan.results)

    def fingerprint(self, config: PlanConfig | None = None) -> str:
        """Results computed under another spec, or another content of its files or `config`'s, must not be mixed
        into this plan's table; only `config`'s own files count, so adding one to a sweep spares the others."""
        names = (self.workload, self.residual_profile, *((config.model, config.hardware) if config else ()))
        data = {**asdict(self), "digests": {str(n): self.digests[n] for n in names if n in self.digests}}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@lru_cache(maxsize=4)
def base_requests(workload: str, max_requests: int | None, length_scale: float | None,
                  vocab_size: int, max_prompt_tokens: int | None = None) -> tuple[SimRequest, ...]:
    """The workload's requests at time scale 1, generated once per process and reused at every rate; a
    prompt longer than `max_prompt_tokens` comes without ids (never made: it will be refused)."""
    from workloads import load_workload

    w = load_workload(workload)
    if length_scale is not None:
        w = w.scaled(length_factor=length_scale)
    reqs = tuple(SimRequest(request_id=r.request_id, arrival=r.arrival, prompt_token_ids=r.prompt_token_ids,
                            max_tokens=r.max_tokens, add_time=r.arrival, num_prompt_tokens=r.num_prompt_tokens,
                            prompt_block_hashes={})
                 for r in w.requests(vocab_size=vocab_size, limit=max_requests, max_prompt_tokens=max_prompt_tokens))
    if len(reqs) < 2 or reqs[-1].arrival <= reqs[0].arrival:
        raise ValueError(f"{workload}: needs at least two requests at different times to define a rate")
    return reqs


def base_rate(reqs: tuple[SimRequest, ...]) -> float:
    return (len(reqs) - 1) / (reqs[-1].arrival - reqs[0].arrival)


def offered(spec: PlanSpec, max_model_len: int | None, rate: float) -> tuple[tuple[SimRequest, ...], Window]:
    """The stream `rate` is judged on, at the workload's own rate (run_at_rate scales it), and its window."""
    base = base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, max_model_len)
    window = window_at(spec, rate)
    return offered_requests(base, window, spec.vocab_size), window


def window_at(spec: PlanSpec, rate: float) -> Window:
    """The measurement window at `rate`, from the workload's lengths alone (no prompt's ids are made)."""
    base = base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, 0)
    return Window.for_rate(len(base), rate, spec.window, spec.lifetime_s)


def request_lifetime(spec: PlanSpec, configs: Iterable[PlanConfig]) -> float:
    """Seconds a mean request of the workload lives (its output tokens at one decode step each) on the
    slowest configuration with every seat taken: what the measurement window must outlast."""
    reqs = base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, 0)  # lengths only
    out = float(np.mean([r.max_tokens or 1 for r in reqs]))
    context = int(np.mean([r.num_prompt_tokens or 0 for r in reqs]) + out / 2)
    longest = 0.0
    for config in configs:
        try:
            sched, _, cost = build_cluster_parts(config)
        except ValueError:
            continue  # evaluate_config says why
        step = cost.decode_step_times(sched.max_num_seqs, context * sched.max_num_seqs, 1)
        if step is not None:
            longest = max(longest, out * step.totals()[0])
    return longest


def slo_check(requests: pd.DataFrame, slos: list[SLO], window: Window, stream: tuple[SimRequest, ...],
              rate: float, min_served_ratio: float = 0.0) -> dict[str, Any]:
    """The SLOs over the window's requests (traces.metrics.evaluate_slos: those that did not finish miss
    them), and whether the deployment kept up over the window: served at least `min_served_ratio` x the
    offered rate there."""
    ids = window_ids(stream, window)
    verdict = evaluate_slos(requests[requests["request_id"].isin(ids)], slos, population=window.requests)
    # A percentile among the unfinished has no value (None: plots mark it, a results file keeps it as null).
    out: dict[str, Any] = {r.slo.label: None if math.isinf(r.measured_s) else r.measured_s for r in verdict.results}
    out.update(served_over_window(requests, window, window_span(stream, window, base_rate(stream[:window.base]) / rate)))
    out["attainment"] = verdict.attainment
    out["meets"] = verdict.met and out["served_ratio"] >= min_served_ratio
    return out


def search_max_rate(meets: Callable[[float], bool], start: float, tol: float,
                    max_doublings: int = 12) -> tuple[float, bool]:
    """Highest rate that `meets`, bracketed by doubling/halving from `start`, then bisected until
    rate * (1 + tol) has been tried and failed. Returns (rate, capped); rate 0 when even
    start / 2**max_doublings fails, capped when start * 2**max_doublings still meets."""
    if meets(start):
        lo, above = start, None
        for _ in range(max_doublings):
            if not meets(lo * 2):
                above = lo * 2
                break
            lo *= 2
        if above is None:
            return lo, True
        return _bisect(meets, lo, above, tol), False
    hi, below = start, None
    for _ in range(max_doublings):
        if meets(hi / 2):
            below = hi / 2
            break
        hi /= 2
    if below is None:
        return 0.0, False
    return _bisect(meets, below, hi, tol), False


def _bisect(meets: Callable[[float], bool], lo: float, hi: float, tol: float) -> float:
    """The highest rate that `meets` between `lo` (meets) and `hi` (does not), once lo * (1 + tol) has
    been tried and failed, bisecting geometrically."""
    while True:
        step = lo * (1 + tol)
        if hi <= step:
            if hi == step or not meets(step):
                return lo
            lo = step
            continue
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid


def build_cluster_parts(config: PlanConfig) -> tuple[SchedulerConfig, CacheConfig, CostModel]:
    """(SchedulerConfig, CacheConfig, cost model) of a configuration; KV blocks from the roofline model."""
    from sim.cost_models.roofline import RooflineCostModel

    cost = RooflineCostModel.from_args(model=config.model, hardware=config.hardware, deployment=config.deployment(),
                                       async_scheduling=bool(config.async_scheduling))
    sched = config.scheduler_config()
    cache = config.cache_config(num_gpu_blocks=2)
    if config.num_gpu_blocks is None:
        blocks = cost.num_gpu_blocks(cache.block_size, cache.gpu_memory_utilization, sched.token_budget)
        cache = config.cache_config(num_gpu_blocks=blocks)
    return sched, cache, cost


def _median_tpot(done: pd.DataFrame) -> float | None:
    """Median time per output token after the first: its inverse is the decode speed one user sees."""
    tpot = request_latencies(done)["tpot"].dropna()
    return float(tpot.median()) if len(tpot) else None


@lru_cache(maxsize=2)
def residual_table(profile: str) -> ResidualTable:
    """The measured residual table of a calibration profile (see sim.cost_models.residuals)."""
    from sim.cost_models.profile import load_profile

    table = load_profile(profile).residuals
    if table is None:
        raise ValueError(f"{profile}: residuals: missing (a profile from an older sim calibrate); recalibrate")
    return table


def run_at_rate(spec: PlanSpec, config: PlanConfig, rate: float, trace_dir: str | None = None,
                watch: MissWatch | None = None, residual_seed: int | None = None,
                overwrite: bool = False, headroom: HeadroomReport | None = None) -> pd.DataFrame:
    """The cluster's requests table with the workload's arrivals scaled to `rate` requests/s (`watch` may
    stop the run early, see `Cluster.run`); with `residual_seed`, step times carry one seeded draw of the
    profile's measured scatter. `headroom` takes in how near the run came to its limits, at its
    `peak_blocks`' block sizes (sim.core.headroom)."""
    from sim.core.cluster import Cluster
    from sim.core.stepping import fewer_collections

    reqs, window = offered(spec, config.max_model_len, rate)
    scale = base_rate(reqs[:window.base]) / rate
    sched, cache, cost = build_cluster_parts(config)
    if residual_seed is not None and spec.residual_profile:
        from sim.cost_models.residuals import ResidualScaled

        cost = ResidualScaled(cost, residual_table(spec.residual_profile), residual_seed)
    stream = (SimRequest(request_id=r.request_id, arrival=r.arrival * scale, prompt_token_ids=r.prompt_token_ids,
                         max_tokens=r.max_tokens, add_time=r.add_time * scale, num_prompt_tokens=r.num_prompt_tokens,
                         prompt_block_hashes=r.prompt_block_hashes)
              for r in reqs)
    # A search runs many short simulations: each is freed as soon as it is read (Cluster.release), and no
    # collection runs before then, which would pass over all of it while it is still alive.
    with fewer_collections():
        cluster = Cluster(config.replicas, sched, cache, cost, config.router, trace_dir=trace_dir,
                          meta={"plan": {"config": config.to_dict(), "rate": rate}}, seed=spec.seed,
                          vocab_size=spec.vocab_size, overwrite=overwrite,
                          headroom_block_sizes=tuple(headroom.peak_blocks) if headroom is not None else None,
                          data_parallel_size=config.data_parallel_size)
        try:
            result = cluster.run(stream, watch)
        finally:
            cluster.release()
    if headroom is not None and result.headroom is not None:
        headroom.merge(result.headroom)
    assert result.requests is not None  # the cluster keeps its requests unless told not to
    return result.requests


@dataclass(slots=True, kw_only=True)
class ConfigResult:
    """One configuration's answer: its max rate within the SLOs and what was measured there, and every
    simulated point (a dict per rate, the SLO labels among its keys, for the plots). Plain data: it comes
    back from worker processes and Ray tasks, and a results file keeps it as JSON (`to_json`)."""

    max_rate: float
    capped: bool = False
    max_rate_interval: dict[str, Any] | None = None
    attainment: float = 0.0
    served_rate: float = 0.0  # requests taken into service per second over the measurement window, at max_rate
    window_s: float = 0.0  # the window's length at max_rate (simulated seconds)
    mean_output_tokens: float = 0.0
    prefix_hit_rate: float = 0.0
    user_tok_s: float | None = None
    slo_measured: dict[str, float | None] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None  # why the configuration could not run at all
    # How near its runs came to max_num_seqs and a full KV cache, all of them and the run at each rate
    # of `points` (sim.plan.reuse reads them).
    headroom: HeadroomReport | None = None
    headroom_at: dict[float, HeadroomReport] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConfigResult:
        """From a results file's `result`, written by this or an older version (fields it lacks default)."""
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in data.items() if k in known})
        if isinstance(data.get("headroom"), dict):
            out.headroom = _headroom_from_json(data["headroom"])
        out.headroom_at = {float(rate): _headroom_from_json(room) for rate, room in (data.get("headroom_at") or {}).items()
                           if isinstance(room, dict)}
        return out


def _headroom_from_json(room: dict[str, Any]) -> HeadroomReport:
    """JSON made the block sizes strings."""
    return HeadroomReport(peak_running=int(room.get("peak_running", 0)),
                          peak_blocks={int(k): int(v) for k, v in (room.get("peak_blocks") or {}).items()},
                          preempted=bool(room.get("preempted", False)))


def evaluate_config(spec: PlanSpec, config: PlanConfig, headroom_block_sizes: tuple[int, ...] = (),
                    proven: dict[float, tuple[dict[str, Any], HeadroomReport]] | None = None) -> ConfigResult:
    """Max rate within the SLOs for one configuration, with every simulated point (for plots) and how near
    its runs came to their limits (KV blocks at `headroom_block_sizes` and its own block size). `proven`:
    the points (and their runs' headroom) at rates where this configuration's run is proven to be one
    already simulated (sim.plan.reuse), taken instead of simulating it again."""
    from sim.core.stepping import SimulationError
    from traces.summary import rejections

    slos = parse_slo(spec.slo)
    base = base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, config.max_model_len)
    points: dict[float, dict[str, Any]] = {}
    sizes = sorted({*headroom_block_sizes, config.block_size})
    headroom = HeadroomReport(peak_blocks=dict.fromkeys(sizes, 0))
    headroom_at: dict[float, HeadroomReport] = {}

    def meets(rate: float) -> bool:
        if rate in points:
            return points[rate]["meets"]
        if proven and rate in proven:
            points[rate], headroom_at[rate] = proven[rate]
            headroom.merge(headroom_at[rate])
            return points[rate]["meets"]
        room = headroom_at[rate] = HeadroomReport(peak_blocks=dict.fromkeys(sizes, 0))
        stream, window = offered(spec, config.max_model_len, rate)
        ids = window_ids(stream, window)
        try:
            table = run_at_rate(spec, config, rate, watch=MissWatch(slos, window.requests, ids), headroom=room)
            p = slo_check(table, slos, window, stream, rate, spec.min_served_ratio)
            p["rejected"] = rejections(table)
            done = finished(table[table["request_id"].isin(ids)])
            p["mean_output_tokens"] = float(done["num_output_tokens"].mean()) if len(done) else 0.0
            p["prefix_hit_rate"] = (float(done["num_cached_tokens"].sum() / done["num_prompt_tokens"].sum())
                                    if len(done) else 0.0)
            p["tpot_p50"] = _median_tpot(done)
        except SimulationError as e:
            p = {"meets": False, "error": str(e)}
        points[rate] = {"rate": rate, **p}
        headroom.merge(room)
        return points[rate]["meets"]

    try:
        build_cluster_parts(config)
    except ValueError as e:
        return ConfigResult(max_rate=0.0, note=str(e))
    rate, capped = search_max_rate(meets, base_rate(base), spec.rate_tol, spec.max_doublings)
    best = points.get(rate, {})
    spread = sampled_max_rates(spec, config, rate, slos, headroom) if spec.samples and rate > 0 else None
    return ConfigResult(
        max_rate=rate, capped=capped, max_rate_interval=spread, attainment=best.get("attainment", 0.0),
        served_rate=best.get("served_rate", 0.0), window_s=best.get("window_s", 0.0),
        mean_output_tokens=best.get("mean_output_tokens", 0.0), prefix_hit_rate=best.get("prefix_hit_rate", 0.0),
        user_tok_s=1.0 / best["tpot_p50"] if best.get("tpot_p50") else None,
        slo_measured={s.label: best.get(s.label) for s in slos},
        # Admission does not depend on the rate; a run stopped early by the SLO watch may see fewer.
        rejected=max((p.get("rejected") or {} for p in points.values()), key=lambda r: sum(r.values()), default={}),
        points=[points[r] for r in sorted(points)], headroom=headroom, headroom_at=headroom_at)


def sampled_max_rates(spec: PlanSpec, config: PlanConfig, nominal: float, slos: list[SLO],
                      headroom: HeadroomReport | None = None) -> dict[str, Any]:
    """The max rate again under `spec.samples` seeded draws of the measured step-time scatter, each search
    started at the nominal answer (a few simulations each): median and p5-p95 of the max rate."""
    from sim.core.stepping import SimulationError
    from sim.fidelity.samples import interval

    rates = []
    for seed in range(spec.samples):
        def meets(rate: float, seed: int = seed) -> bool:
            stream, window = offered(spec, config.max_model_len, rate)
            ids = window_ids(stream, window)
            try:
                table = run_at_rate(spec, config, rate, watch=MissWatch(slos, window.requests, ids),
                                    residual_seed=seed, headroom=headroom)
            except SimulationError:
                return False
            return slo_check(table, slos, window, stream, rate, spec.min_served_ratio)["meets"]

        rates.append(search_max_rate(meets, nominal, spec.rate_tol, spec.max_doublings)[0])
    return {**interval(rates), "samples": rates}
