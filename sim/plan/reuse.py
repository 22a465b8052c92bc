"""Configurations whose simulations cannot differ from one already run are not run again.

A sweep over `max_num_seqs` and `block_size` often has configurations that decide every step alike. Each
run measures how near it came to those limits (sim.core.headroom); a configuration of the same family
(equal in every other field) then makes, at every rate the search tries, exactly the runs of one already
evaluated, so its result is that one's, when (`Proofs.same_run`):

- caps: equal, or the running requests never reached the smaller one (admission reads the cap only as
  `len(running) < max_num_seqs`);
- block sizes: equal, or at both sizes the pool is never short and gives no prefix hit: no preemption,
  the running requests at their token limits fit either pool, no two prompts share a first block at the
  smaller size, and both pools refuse the same requests; routers that read the blocks void this.

Families are evaluated in rounds, one configuration of a family a round, so the sweep stays parallel.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sim.plan.config import PlanConfig
from sim.core.headroom import HeadroomReport
from sim.core.routers import make_router
from sim.core.sources import SimRequest
from sim.plan.search import ConfigResult, PlanSpec, base_requests, build_cluster_parts, evaluate_config
from sim.plan.sweep import Done, open_workers, run_sweep

FAMILY_AXES = ("max_num_seqs", "block_size")


def family(config: PlanConfig) -> str:
    """Configurations of one family differ only in FAMILY_AXES."""
    return config.key_without(FAMILY_AXES)


Proven = dict[float, tuple[dict[str, Any], HeadroomReport]]


@dataclass(frozen=True, slots=True)
class Evaluate:
    """`evaluate_config` measuring the headroom at every block size of the sweep and taking the points
    proven for each configuration, by key (picklable: it travels to worker processes)."""

    block_sizes: tuple[int, ...]
    proven: dict[str, Proven] = field(default_factory=dict)

    def __call__(self, spec: PlanSpec, config: PlanConfig) -> ConfigResult:
        return evaluate_config(spec, config, self.block_sizes, self.proven.get(config.key))


@dataclass(frozen=True, slots=True)
class Limits:
    """What of a configuration its runs' decisions could depend on besides the shared fields."""

    max_num_seqs: int
    block_size: int
    usable_blocks: int
    watermark_blocks: int
    refused: frozenset[str]  # requests the pool refuses outright (longer than the whole cache)
    prefix_caching: bool


class Proofs:
    """`same_run` for the configurations of one plan, with what it reads of each computed once."""

    def __init__(self, spec: PlanSpec) -> None:
        self.spec = spec
        self._limits: dict[str, Limits] = {}
        self._shared: dict[tuple[int, int], bool] = {}

    def _requests(self, max_model_len: int) -> tuple[SimRequest, ...]:
        spec = self.spec
        return base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, max_model_len)

    def limits(self, config: PlanConfig) -> Limits:
        """The scheduler's own rules applied to a throwaway scheduler (its pool makes no block until asked)."""
        if config.key not in self._limits:
            from engine.core.async_scheduler import make_scheduler
            from sim.core.sources import make_request

            sched, cache, _ = build_cluster_parts(config)
            kv = make_scheduler(sched, cache).kv_cache_manager
            probe = make_scheduler(sched, dataclasses.replace(cache, enable_prefix_caching=False))
            refused = frozenset(r.request_id for r in self._requests(config.max_model_len)
                                if r.prompt_token_ids is not None and not probe.add_request(make_request(r)))
            self._limits[config.key] = Limits(sched.max_num_seqs, cache.block_size, kv.block_pool.num_usable_blocks,
                                              kv.watermark_blocks, refused, cache.enable_prefix_caching)
        return self._limits[config.key]

    def prompts_share_a_first_block(self, max_model_len: int, block_size: int) -> bool:
        key = (max_model_len, block_size)
        if key not in self._shared:
            firsts = [tuple(r.prompt_token_ids[:block_size]) for r in self._requests(max_model_len)
                      if r.prompt_token_ids is not None and len(r.prompt_token_ids) >= block_size]
            self._shared[key] = len(set(firsts)) < len(firsts)
        return self._shared[key]

    def same_search(self, ran: PlanConfig, result: ConfigResult, other: PlanConfig) -> bool:
        """Whether `other` (of `ran`'s family) runs exactly as `ran` did at every rate of its search."""
        return result.headroom is not None and result.note is None and self.same_run(ran, result.headroom, other)

    def proven_points(self, ran: PlanConfig, result: ConfigResult, other: PlanConfig) -> Proven:
        """The points of `ran`'s search at whose rates `other` runs exactly as `ran` did."""
        if result.note is not None:
            return {}
        return {p["rate"]: (p, result.headroom_at[p["rate"]]) for p in result.points
                if p["rate"] in result.headroom_at and self.same_run(ran, result.headroom_at[p["rate"]], other)}

    def same_run(self, ran: PlanConfig, room: HeadroomReport, other: PlanConfig) -> bool:
        """Whether `other` (of `ran`'s family) runs exactly as a run of `ran` that came `room` near its limits.
        The roofline times a step by its batch alone, whatever the cap or block size; a prefix hit needs two
        prompts sharing a first block (without preemption a request never meets its own blocks again); a
        router that reads the replicas' blocks may route differently at another block size."""
        a, b = self.limits(ran), self.limits(other)
        if a.max_num_seqs != b.max_num_seqs and room.peak_running >= min(a.max_num_seqs, b.max_num_seqs):
            return False
        if a.block_size == b.block_size:
            return True
        if room.preempted or a.refused != b.refused:
            return False
        if ran.replicas > 1 and make_router(ran.router).reads_blocks:
            return False
        for lim in (a, b):
            peak = room.peak_blocks.get(lim.block_size)
            if peak is None or peak + lim.watermark_blocks > lim.usable_blocks:
                return False
        smaller = min(a.block_size, b.block_size)
        return not (a.prefix_caching and self.prompts_share_a_first_block(ran.max_model_len, smaller))


@dataclass(slots=True)
class Reused:
    """What a plan took from runs already simulated: whole configurations, and single rates' runs."""

    configs: int = 0
    runs: int = 0
    runs_simulated: int = 0


def run_plan(spec: PlanSpec, configs: Iterable[PlanConfig], on_done: Done, jobs: int = 1,
             ray_address: str | None = None, known: dict[str, ConfigResult] | None = None,
             reuse: bool = True) -> Reused:
    """Every configuration's result to `on_done`: simulated, or (`reuse`) that of one proven to run alike,
    or simulated but for the rates proven to run alike. `known`: results already at hand (a resumed
    results file), by key."""
    configs = list(configs)
    sizes = tuple(sorted({c.block_size for c in configs}))
    reused = Reused()
    if not reuse:
        run_sweep(Evaluate(sizes), spec, configs, on_done, jobs, ray_address)
        return reused
    proofs = Proofs(spec)
    families: dict[str, list[PlanConfig]] = {}
    for c in sorted(configs, key=lambda c: (-c.scheduler_config().max_num_seqs, c.block_size)):
        families.setdefault(family(c), []).append(c)
    evaluated: dict[str, list[tuple[PlanConfig, ConfigResult]]] = {k: [] for k in families}
    for key, result in (known or {}).items():  # resumed results count as evaluated: they carry their headroom
        config = PlanConfig(**json.loads(key))
        if family(config) in evaluated:
            evaluated[family(config)].append((config, result))

    def record(config: PlanConfig, result: ConfigResult) -> None:
        evaluated[family(config)].append((config, result))
        on_done(config, result)

    proven: dict[str, Proven] = {}

    def simulated(config: PlanConfig, result: ConfigResult) -> None:
        taken = len(proven.get(config.key, {}).keys() & {p["rate"] for p in result.points})
        reused.runs += taken
        reused.runs_simulated += len(result.points) - taken
        record(config, result)

    with open_workers(jobs, ray_address) as workers:
        def next_member(key: str) -> None:
            """The family's next members taken from runs proven alike, up to the first to simulate, which is
            submitted with the points proven for it (a family's members go one after the other, so the
            families keep every worker busy)."""
            members = families[key]
            while members:
                head = members.pop(0)
                source = next(((c, r) for c, r in evaluated[key] if proofs.same_search(c, r, head)), None)
                if source is None:
                    proven[head.key] = {rate: point for c, r in evaluated[key]
                                        for rate, point in proofs.proven_points(c, r, head).items()}
                    workers.submit(Evaluate(sizes, {head.key: proven[head.key]}), spec, head)
                    return
                reused.configs += 1
                record(head, copy.deepcopy(source[1]))

        for key in families:
            next_member(key)
        while workers.pending:
            config, result = workers.next_done()
            simulated(config, result)
            next_member(family(config))
    return reused
