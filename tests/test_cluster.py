"""Cluster simulation: one replica reproduces the single-replica simulator, the routers route as
specified, and a cluster trace carries a `replica` column that traces.load reads."""
import dataclasses

import pandas as pd
import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.cluster import Cluster, replica_summary
from sim.core.loop import Simulator
from sim.plan.command import base_requests
from sim.core.routers import make_router
from sim.core.sources import SimRequest, open_source
from traces.summary import summarize
from workloads import DEFAULT_WORKLOAD, WORKLOADS_DIR
from sim_helpers import FixedCost

MOONCAKE = str(WORKLOADS_DIR / "mooncake_conversation.yaml")




def _configs(blocks: int = 400, max_num_seqs: int = 16) -> tuple[SchedulerConfig, CacheConfig]:
    return SchedulerConfig(max_model_len=4096, max_num_seqs=max_num_seqs), CacheConfig(block_size=16,
                                                                                        num_gpu_blocks=blocks)


def _req(i: int, arrival: float, prompt: int = 32, out: int = 4) -> SimRequest:
    return SimRequest(request_id=f"r{i}", arrival=arrival, prompt_token_ids=[3 + (i * 7 + k) % 500 for k in range(prompt)],
                      max_tokens=out, add_time=arrival)


def _replicas(result) -> list[int]:
    df = result.requests.assign(n=result.requests["request_id"].str[1:].astype(int)).sort_values("n")
    return df["replica"].tolist()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_replica_cluster_reproduces_the_single_replica_simulator(tmp_path, async_scheduling):
    sched, cache = _configs(blocks=300, max_num_seqs=8)
    sched = dataclasses.replace(sched, async_scheduling=async_scheduling)
    Simulator(sched, cache, FixedCost(), tmp_path / "single").run(
        open_source(str(DEFAULT_WORKLOAD), limit=60, time_scale=0.2).requests)
    Cluster(1, sched, cache, FixedCost(), "round_robin", trace_dir=tmp_path / "cluster").run(
        open_source(str(DEFAULT_WORKLOAD), limit=60, time_scale=0.2).requests)
    a, b = traces.load(tmp_path / "single"), traces.load(tmp_path / "cluster")
    assert a.meta["config"]["scheduler"]["async_scheduling"] is async_scheduling
    assert a.steps["num_preempted"].sum() > 0  # the scenario exercises preemption, not only easy steps
    pd.testing.assert_frame_equal(a.steps, b.steps.drop(columns="replica"))
    pd.testing.assert_frame_equal(a.requests.drop(columns=["prompt_token_ids", "output_token_ids"]),
                                  b.requests.drop(columns=["prompt_token_ids", "output_token_ids", "replica"]))


def test_cluster_trace_has_a_replica_column_and_cluster_wide_step_numbers(tmp_path):
    sched, cache = _configs()
    Cluster(3, sched, cache, FixedCost(), "round_robin", trace_dir=tmp_path / "t", meta={"workload": "x"}).run(
        [_req(i, 0.001 * i) for i in range(12)])
    t = traces.load(tmp_path / "t")
    assert t.meta["cluster"]["replicas"] == 3
    for table in (t.steps, t.requests, t.decisions):
        assert sorted(table["replica"].unique()) == [0, 1, 2]
    assert t.steps["step"].is_unique and t.steps["end"].is_monotonic_increasing
    # Each decision's step belongs to a step row of the same replica.
    merged = t.decisions.merge(t.steps[["step", "replica"]], on="step", suffixes=("", "_step"))
    assert len(merged) == len(t.decisions) and (merged["replica"] == merged["replica_step"]).all()
    summary = replica_summary(t.requests)
    assert summary["replica"].tolist() == ["0", "1", "2", "all"] and summary["finished"].tolist() == [4, 4, 4, 12]


def test_round_robin_cycles_through_the_replicas():
    sched, cache = _configs()
    result = Cluster(3, sched, cache, FixedCost(), "round_robin").run([_req(i, 0.001 * i) for i in range(7)])
    assert _replicas(result) == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_picks_the_idle_replica():
    sched, cache = _configs()
    # r0 runs long on replica 0, r1 short on replica 1; r2 and r3 each arrive when replica 1 is idle again.
    reqs = [_req(0, 0.0, out=200), _req(1, 0.0, out=2), _req(2, 0.5, out=2), _req(3, 0.6, out=2)]
    result = Cluster(2, sched, cache, FixedCost(), "least_outstanding").run(reqs)
    assert _replicas(result) == [0, 1, 1, 1]


def test_least_kv_prefers_the_replica_with_the_emptier_cache():
    sched, cache = _configs()
    # r0's long prompt fills replica 0's cache; r1 (tiny) goes to 1; r2 arrives with both busy, one each.
    reqs = [_req(0, 0.0, prompt=1600, out=200), _req(1, 0.0, prompt=16, out=200), _req(2, 0.3, out=2)]
    result = Cluster(2, sched, cache, FixedCost(), "least_kv").run(reqs)
    assert _replicas(result) == [0, 1, 1]


def test_power_of_two_is_deterministic_for_a_seed():
    sched, cache = _configs()
    reqs = [_req(i, 0.002 * i, out=30) for i in range(60)]

    def run(seed: int) -> list[int]:
        return _replicas(Cluster(4, sched, cache, FixedCost(), make_router("power_of_two", seed)).run(reqs))

    first = run(1)
    assert run(1) == first
    assert run(2) != first
    assert sorted(set(first)) == [0, 1, 2, 3]


def test_prefix_affinity_raises_the_prefix_hit_rate_on_the_mooncake_trace():
    reqs = base_requests(MOONCAKE, 400, 1 / 16, 32000)  # 512-token hash blocks become 32 tokens
    sched, cache = SchedulerConfig(max_model_len=16384), CacheConfig(block_size=16, num_gpu_blocks=20000)

    def hit_rate(router: str) -> float:
        return summarize(Cluster(4, sched, cache, FixedCost(), router).run(reqs).requests)["prefix_hit_rate"]

    rr, affinity = hit_rate("round_robin"), hit_rate("prefix_affinity")
    assert affinity > 1.5 * rr


def test_unknown_router_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        make_router("nearest")
