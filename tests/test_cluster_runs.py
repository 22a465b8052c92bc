"""Decode runs in a cluster (sim.core.decode_runs) are invisible in the result: a cluster that advances its
replicas' decode-only stretches as runs ends every request exactly as the step-by-step loop does, for
every router and replica count, with a per-step and an at-once cost model, when the SLO watch stops
it in the middle of a run, and a one-replica cluster still reproduces the single-replica simulator."""
import pandas as pd
from pathlib import Path

import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.cluster import Cluster
from sim.core.decode_runs import DecodeRuns
from sim.cost_models.roofline import RooflineCostModel
from sim.core.simulator import Simulator
from sim.plan.watch import MissWatch
from traces.metrics import parse_slo
from sim.core.routers import ROUTERS
from sim.core.sources import open_source
from sim_helpers import FixedCost


def _configs(blocks: int = 400) -> tuple[SchedulerConfig, CacheConfig]:
    return (SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512),
            CacheConfig(block_size=16, num_gpu_blocks=blocks))


# The bursty workload as these cases were chosen on (its prompts up to 4096 tokens), kept here so a change
# to the shipped workload does not move the stops the cases are about.
WORKLOAD = Path(__file__).resolve().parent / "data" / "cluster_runs.yaml"


def _requests(time_scale: float, limit: int = 60) -> list:
    return list(open_source(str(WORKLOAD), limit=limit, time_scale=time_scale).requests)


def _roofline() -> RooflineCostModel:
    return RooflineCostModel.from_args(model="llama-3.1-8b", hardware="l4")


def _run(replicas: int, router: str, decode_runs: bool, cost=None, blocks: int = 400, time_scale: float = 1.0,
         watch=None, limit: int = 60):
    sched, cache = _configs(blocks)
    cluster = Cluster(replicas, sched, cache, cost or FixedCost(), router, decode_runs=decode_runs)
    result = cluster.run(_requests(time_scale, limit), watch)
    return cluster, result


def _tokens(cluster: Cluster) -> dict[str, list[int]]:
    return {q.request_id: list(q.output_token_ids) for r in cluster.replicas for q in r.added}


def _assert_same(a, b) -> None:
    (cluster_a, result_a), (cluster_b, result_b) = a, b
    pd.testing.assert_frame_equal(result_a.requests, result_b.requests, check_exact=True)
    assert (result_a.num_steps, result_a.sim_time, result_a.stopped) == (result_b.num_steps, result_b.sim_time,
                                                                        result_b.stopped)
    assert _tokens(cluster_a) == _tokens(cluster_b)


def _run_steps(cluster: Cluster) -> int:
    return sum(r.runs.num_steps for r in cluster.replicas)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_runs_end_every_request_as_the_step_by_step_cluster(router, replicas):
    runs = _run(replicas, router, True)
    _assert_same(runs, _run(replicas, router, False))
    assert _run_steps(runs[0]) > 0


@pytest.mark.parametrize("router", ["least_kv", "prefix_affinity"])
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_runs_timed_at_once_end_every_request_as_the_step_by_step_cluster(router, replicas):
    """The roofline times a run in one call; with a short pool (90 blocks) runs stop at block shortage."""
    for blocks, time_scale in ((400, 0.3), (400, 3.0), (90, 0.3)):
        runs = _run(replicas, router, True, _roofline(), blocks, time_scale)
        _assert_same(runs, _run(replicas, router, False, _roofline(), blocks, time_scale))
        assert _run_steps(runs[0]) > 0


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_watch_stop_in_the_middle_of_runs_leaves_the_step_by_step_result(monkeypatch, replicas):
    """The SLO watch stops the cluster at a finish on one replica while others are inside runs that
    end later: the steps of those runs after the stop are taken back."""
    rewound = []
    rewind = DecodeRuns.rewind
    monkeypatch.setattr(DecodeRuns, "rewind", lambda self, t: rewound.append(rewind(self, t)) or rewound[-1])
    for slo in ("ttft_p99=100ms", "ttft_p50=300ms"):
        watches = [MissWatch(parse_slo(slo), 60) for _ in range(2)]
        for w in watches:
            w.interval = None  # stopped by a finish only
        runs = _run(replicas, "least_outstanding", True, _roofline(), time_scale=0.5, watch=watches[0])
        _assert_same(runs, _run(replicas, "least_outstanding", False, _roofline(), time_scale=0.5, watch=watches[1]))
        assert runs[1].stopped
    assert sum(rewound) > 0


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_watch_that_sees_requests_in_flight_stops_sooner_with_the_step_by_step_result(replicas):
    """Requests still waiting past the TTFT threshold are misses already: the overloaded run stops before
    the finish-only watch would stop it, at the same point with runs or without."""
    slos = parse_slo("ttft_p90=100ms")
    finish_only = MissWatch(slos, 60)
    finish_only.interval = None
    late = _run(replicas, "least_outstanding", True, _roofline(), time_scale=0.2, watch=finish_only)[1]
    runs = _run(replicas, "least_outstanding", True, _roofline(), time_scale=0.2, watch=MissWatch(slos, 60))
    _assert_same(runs, _run(replicas, "least_outstanding", False, _roofline(), time_scale=0.2,
                            watch=MissWatch(slos, 60)))
    assert late.stopped and runs[1].stopped and runs[1].sim_time < late.sim_time


def test_a_cluster_that_writes_a_trace_takes_its_steps_one_by_one(tmp_path):
    sched, cache = _configs()
    cluster = Cluster(2, sched, cache, FixedCost(), "round_robin", trace_dir=tmp_path / "t")
    assert all(r.runs is None for r in cluster.replicas)


def test_most_steps_of_a_decode_heavy_cluster_go_through_runs():
    cluster, result = _run(2, "least_outstanding", True, time_scale=3.0)
    assert _run_steps(cluster) > 0.8 * result.num_steps


def test_one_replica_cluster_with_runs_reproduces_the_single_replica_simulator(tmp_path):
    sched, cache = _configs()
    Simulator(sched, cache, _roofline(), tmp_path / "single", decode_runs=False).run(_requests(1.0))
    single = traces.load(tmp_path / "single").requests
    _, result = _run(1, "round_robin", True, _roofline())
    columns = [c for c in result.requests.columns if c in single.columns]
    pd.testing.assert_frame_equal(single[columns].sort_values("request_id", ignore_index=True),
                                  result.requests[columns].sort_values("request_id", ignore_index=True),
                                  check_exact=True, check_dtype=False)
