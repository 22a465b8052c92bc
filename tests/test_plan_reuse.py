"""A plan does not simulate again what it has proven to run alike (sim.plan.reuse): every configuration's
result is what simulating it gives, and each proof refuses when its limit may have bound."""
import json

import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.cluster import Cluster
from sim.core.headroom import HeadroomReport
from sim.core.sources import open_source
from sim.plan.config import PlanConfig
from sim.plan.reuse import Proofs, run_plan
from sim.plan.search import ConfigResult, PlanSpec
from sim.plan.sweep import expand_configs, parse_sweep
from sim_helpers import FixedCost
from workloads import DEFAULT_WORKLOAD, WORKLOADS_DIR

POISSON = str(WORKLOADS_DIR / "poisson.yaml")
SPEC = PlanSpec(workload=POISSON, slo="ttft_p99=500ms,tpot_p99=10ms", rate_tol=0.1, max_requests=40)
CONFIG = PlanConfig(max_model_len=8192)


def _plan(reuse: bool):
    configs = expand_configs(parse_sweep("max_num_seqs=4,16,256,block_size=16,32"), CONFIG)
    results: dict[str, ConfigResult] = {}
    reused = run_plan(SPEC, configs, lambda c, r: results.__setitem__(c.key, r), jobs=1, reuse=reuse)
    return results, reused


def test_a_plan_that_takes_proven_runs_gives_every_configuration_the_result_of_simulating_it():
    taken, reused = _plan(reuse=True)
    simulated, _ = _plan(reuse=False)
    assert reused.configs > 0 and reused.runs > 0  # both kinds of proof are exercised
    assert taken == simulated
    assert len({r.max_rate for r in simulated.values()}) > 1  # the caps bind somewhere: not a trivial sweep


def test_running_requests_that_reached_the_smaller_cap_prove_nothing():
    proofs = Proofs(SPEC)
    big, small = PlanConfig(max_model_len=8192, max_num_seqs=256), PlanConfig(max_model_len=8192, max_num_seqs=16)
    assert proofs.same_run(big, HeadroomReport(peak_running=15, peak_blocks={16: 10}), small)
    assert not proofs.same_run(big, HeadroomReport(peak_running=16, peak_blocks={16: 10}), small)


def test_a_pool_the_running_requests_could_fill_proves_nothing_across_block_sizes():
    proofs = Proofs(SPEC)
    a, b = PlanConfig(max_model_len=8192, block_size=16), PlanConfig(max_model_len=8192, block_size=32)
    room = proofs.limits(b).usable_blocks - proofs.limits(b).watermark_blocks
    assert proofs.same_run(a, HeadroomReport(peak_blocks={16: 100, 32: room}), b)
    assert not proofs.same_run(a, HeadroomReport(peak_blocks={16: 100, 32: room + 1}), b)
    assert not proofs.same_run(a, HeadroomReport(peak_blocks={16: 100, 32: 50}, preempted=True), b)


def test_a_router_that_reads_the_replicas_kv_usage_voids_the_block_size_proof():
    proofs = Proofs(SPEC)
    room = HeadroomReport(peak_blocks={16: 10, 32: 5})
    for router, proven in (("least_outstanding", True), ("least_kv", False)):
        a, b = (PlanConfig(max_model_len=8192, replicas=2, router=router, block_size=size) for size in (16, 32))
        assert proofs.same_run(a, room, b) is proven


def test_prompts_that_share_a_first_block_prove_nothing_across_block_sizes():
    proofs = Proofs(PlanSpec(workload=str(DEFAULT_WORKLOAD), slo="ttft_p99=1s", max_requests=40))
    a, b = PlanConfig(max_model_len=8192, block_size=16), PlanConfig(max_model_len=8192, block_size=32)
    assert proofs.prompts_share_a_first_block(8192, 16)
    assert not proofs.same_run(a, HeadroomReport(peak_blocks={16: 1, 32: 1}), b)


def test_a_results_file_keeps_the_headroom_a_resumed_plan_proves_with():
    result = ConfigResult(max_rate=2.5, points=[{"rate": 2.5, "meets": True}],
                          headroom=HeadroomReport(peak_running=7, peak_blocks={16: 40, 32: 21}),
                          headroom_at={2.5: HeadroomReport(peak_running=7, peak_blocks={16: 40, 32: 21})})
    assert ConfigResult.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_headroom_peaks_are_the_trace_s_most_running_requests_and_bound_its_blocks(tmp_path, async_scheduling):
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=8, async_scheduling=async_scheduling)
    cache = CacheConfig(block_size=16, num_gpu_blocks=2000)
    result = Cluster(1, sched, cache, FixedCost(), trace_dir=tmp_path / "t", headroom_block_sizes=(16, 32)).run(
        open_source(POISSON, limit=40, time_scale=0.05).requests)
    steps = traces.load(tmp_path / "t").steps
    assert result.headroom.peak_running == steps["num_running"].max() == 8
    assert steps["kv_blocks_used"].max() <= result.headroom.peak_blocks[16]
    assert result.headroom.peak_blocks[32] < result.headroom.peak_blocks[16] and not result.headroom.preempted
