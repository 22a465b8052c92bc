"""Cluster simulation: one replica reproduces the single-replica simulator, the routers route as
specified, and a cluster trace carries a `replica` column that traces.load reads."""
import dataclasses
import gc

import pandas as pd
import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager
from sim.core.cluster import Cluster, replica_summary
from sim.core.stepping import SimulationError
from sim.cli import main
from sim.plan.config import PlanConfig
from sim.plan.search import PlanSpec, base_rate, base_requests, run_at_rate
from sim.plan.search import build_cluster_parts
from sim.core.routers import make_router
from sim.core.sources import SimRequest
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
def test_one_replica_plan_equals_sim_replay_step_for_step(tmp_path, async_scheduling):
    """`sim plan`'s cluster at one replica and `sim replay` with the same flags make the same run: the
    same steps, decisions and requests, under synchronous and async scheduling alike."""
    # A window of 40 after a warm-up of 10, and 10 more: the workload's own 60 requests, not looped.
    spec = PlanSpec(workload=str(DEFAULT_WORKLOAD), slo="ttft_p99=10s", max_requests=60, window=40)
    config = PlanConfig(max_model_len=4096, max_num_seqs=8, num_gpu_blocks=300, async_scheduling=async_scheduling)
    reqs = base_requests(spec.workload, spec.max_requests, None, spec.vocab_size, config.max_model_len)
    rate = base_rate(reqs) * 5
    run_at_rate(spec, config, rate, str(tmp_path / "plan"))
    assert main(["replay", spec.workload, "--cost-model", "roofline", "--model", config.model, "--hardware",
                 config.hardware, "--max-requests", "60", "--time-scale", repr(base_rate(reqs) / rate),
                 "--max-model-len", "4096", "--max-num-seqs", "8", "--num-gpu-blocks-override", "300",
                 "--async-scheduling" if async_scheduling else "--no-async-scheduling", "--seed", "0",
                 "--trace", str(tmp_path / "replay"), "--no-progress", "--json"]) == 0
    plan, replay = traces.load(tmp_path / "plan"), traces.load(tmp_path / "replay")
    assert plan.meta["config"]["scheduler"]["async_scheduling"] is async_scheduling
    assert plan.steps["num_preempted"].sum() > 0 and plan.steps["num_waiting"].max() > 0
    for table in ("steps", "decisions", "block_events", "requests"):
        pd.testing.assert_frame_equal(getattr(plan, table), getattr(replay, table), check_exact=True)


def test_replay_sizes_the_kv_cache_as_a_plan_with_the_same_flags(tmp_path):
    """The activations reserved for a step's tokens come out of KV memory in both, per the token budget."""
    config = PlanConfig(max_model_len=4096, max_num_batched_tokens=2048)
    assert main(["replay", str(DEFAULT_WORKLOAD), "--cost-model", "roofline", "--max-requests", "2",
                 "--max-model-len", "4096", "--max-num-batched-tokens", "2048", "--trace", str(tmp_path / "t"),
                 "--no-progress", "--json"]) == 0
    planned = build_cluster_parts(config)[1].num_gpu_blocks
    assert traces.load(tmp_path / "t").meta["kv_cache"]["num_blocks"] == planned
    assert build_cluster_parts(dataclasses.replace(config, max_num_batched_tokens=8192))[1].num_gpu_blocks < planned


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_waiting_requests_that_can_never_be_scheduled_end_the_run_with_a_simulation_error(monkeypatch,
                                                                                         async_scheduling):
    """A pool that never has room: every arrival gets one more step (nothing else can change the
    answer), then the run ends with the reason instead of waiting forever."""
    monkeypatch.setattr(KVCacheManager, "allocate_slots", lambda self, *args, **kwargs: None)
    sched, cache = _configs()
    sched = dataclasses.replace(sched, async_scheduling=async_scheduling)
    with pytest.raises(SimulationError, match=r"^stalled at step 3 \(0\.030 s\): 3 waiting request\(s\) can never"):
        Cluster(1, sched, cache, FixedCost()).run([_req(i, 0.01 * i) for i in range(3)])


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


def _garbage_kinds_after(drop) -> set[str]:
    """The kinds of object the garbage collector finds (cyclic garbage) once `drop()` has run."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        drop()
        gc.collect()
        return {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_released_cluster_is_freed_without_the_garbage_collector():
    """A plan simulates hundreds of runs in one process: released, a run's replicas, schedulers, requests
    and blocks go as soon as the cluster does (unreleased, they were cyclic garbage)."""
    sched, cache = _configs(blocks=200, max_num_seqs=4)
    holder = [Cluster(2, sched, cache, FixedCost(), "round_robin")]
    holder[0].run([_req(i, 0.01 * i, prompt=40, out=6) for i in range(12)])

    def drop():
        holder[0].release()
        holder.clear()

    assert not _garbage_kinds_after(drop) & {"Replica", "Scheduler", "Request", "KVCacheBlock"}
