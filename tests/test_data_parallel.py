"""Data-parallel engines in the simulator: ranks in lockstep with dummy batches, the data-parallel MoE
layer's dispatch, vLLM's load-balancing rule, and imported runs' recorded layouts, block counts and
resolved configs."""

import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.cluster import Cluster
from sim.core.data_parallel import DPLoadBalancer
from sim.core.sources import SimRequest
from sim.cost_models.base import CostModelDefaults, CostModelInfo, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cost_models.deployment import Deployment
from sim.cost_models.model_shape import model_shape
from sim.cost_models.roofline import RooflineCostModel
from test_import_run import import_run, make_run
from test_moe_sim import BUNDLE, QWEN3_30B_A3B, QWEN3_MOE, needs_data


# ---- the data-parallel MoE layer ----
def test_data_parallel_moe_block_runs_the_group_s_tokens_and_pays_the_gather():
    model = RooflineCostModel.from_args(model=QWEN3_30B_A3B, hardware="rtx-pro-6000",
                                        deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True))
    alone = model.breakdown(StepBatch(0, 8, 0, 8, 800, 0.0, [], 100, 100, moe_tokens=8))["moe"]
    grouped = model.breakdown(StepBatch(0, 8, 0, 8, 800, 0.0, [], 100, 100, moe_tokens=16))["moe"]
    assert grouped > alone


def test_data_parallel_dispatch_is_priced_from_the_gpu_s_measured_nccl_collectives():
    model = RooflineCostModel.from_args(model=QWEN3_30B_A3B, hardware="rtx-pro-6000",
                                        deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True))
    assert model.collectives is not None and "NCCL" in model.describe().meta["collectives"]
    assert model.collective("all_gather", 4 << 20) == pytest.approx(model.collectives.time("all_gather", 4 << 20, 2))


def test_data_parallel_dispatch_on_a_gpu_nobody_measured_is_priced_from_its_link():
    model = RooflineCostModel.from_args(model=QWEN3_30B_A3B, hardware="rtx-4090",
                                        deployment=Deployment(data_parallel_size=2, enable_expert_parallel=True))
    hw = model.hardware
    assert model.collective("all_gather", 4 << 20) == pytest.approx(hw.gather_time((4 << 20) / 2, 2))


# ---- data-parallel lockstep ----
class _Priced(CostModelDefaults):
    """A step costs 1 ms per token and remembers every batch it priced."""

    name = "fake"

    def __init__(self) -> None:
        self.batches: list[StepBatch] = []

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        self.batches.append(batch)
        return StepTiming(1e-3 * max(batch.num_tokens, batch.padded_tokens))

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


def _request(i: int, prompt: int, output: int, at: float = 0.0) -> SimRequest:
    return SimRequest(request_id=f"r{i}", arrival=at, prompt_token_ids=list(range(1, prompt + 1)), max_tokens=output,
                      add_time=at, num_prompt_tokens=prompt)


def _cluster(cost: _Priced, dp: int = 2, pad: bool = True, async_scheduling: bool = False) -> Cluster:
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024,
                            async_scheduling=async_scheduling)
    return Cluster(1, sched, CacheConfig(num_gpu_blocks=256, enable_prefix_caching=False), cost,
                   data_parallel_size=dp, enforce_eager=not pad)


def test_an_idle_rank_runs_one_token_dummy_batches_while_another_works():
    cost = _Priced()
    _cluster(cost, pad=False).run([_request(0, 10, 4)])
    working = [(a, b) for a, b in zip(cost.batches[0::2], cost.batches[1::2]) if a.context_tokens > 1]
    assert len(working) == 4 and all(b.num_tokens == b.context_tokens == 1 for _, b in working)


def test_ranks_are_padded_to_the_group_s_largest_batch_and_moe_runs_every_rank_s_tokens():
    cost = _Priced()
    _cluster(cost).run([_request(0, 10, 2)])
    first = cost.batches[:2]
    assert [b.padded_tokens for b in first] == [10, 10] and [b.moe_tokens for b in first] == [20, 20]


def test_a_group_step_lasts_its_slowest_rank_s():
    cost = _Priced()
    cluster = _cluster(cost, pad=False)
    result = cluster.run([_request(0, 100, 1), _request(1, 10, 1)])
    assert result.requests is not None
    assert list(result.requests["first_token"]) == pytest.approx([0.100, 0.100])  # the 10-token rank waits


def test_one_request_finishes_as_on_a_single_engine_but_the_group_steps_it():
    cost = _Priced()
    result = _cluster(cost, pad=False).run([_request(0, 10, 3)])
    assert result.requests is not None and set(result.requests["finish_reason"]) == {"length"}
    assert set(result.requests["replica"]) == {0}


def test_async_scheduling_ranks_keep_two_steps_in_flight_and_finish_every_request():
    cost = _Priced()
    result = _cluster(cost, pad=False, async_scheduling=True).run([_request(i, 10 + i, 5, at=0.001 * i)
                                                                  for i in range(6)])
    assert result.requests is not None and list(result.requests["num_output_tokens"]) == [5] * 6
    assert set(result.requests["replica"]) == {0, 1}


# ---- vLLM's data-parallel load balancing ----
def test_balancer_rotates_ranks_on_ties():
    lb = DPLoadBalancer(3)
    assert [lb.assign() for _ in range(3)] == [0, 1, 2]


def test_vllm_0_19_balancer_scores_four_times_the_waiting_plus_the_running():
    lb = DPLoadBalancer(2, "0.19.0")
    lb.loads[0].waiting, lb.loads[1].running = 1, 3  # 4 x 1 + 0 against 0 + 3
    assert lb.assign() == 1


def test_vllm_0_19_balancer_breaks_ties_to_the_lowest_rank():
    lb = DPLoadBalancer(2, "0.19.0")
    for load in lb.loads:
        load.running = 2
    assert lb.assign() == 0 and lb.assign() == 1 and lb.loads[0].waiting == lb.loads[1].waiting == 1


def test_balancer_prefers_the_rank_with_fewer_requests_in_flight():
    lb = DPLoadBalancer(2)
    lb.assign(), lb.assign(), lb.assign()  # ranks 0, 1, 0
    lb.finished(0), lb.finished(0)
    for load in lb.loads:  # the coordinator's next snapshot: nothing waits, rank 1's request runs
        load.waiting, load.running = 0, load.in_flight
    assert lb.assign() == 0


def test_balancer_counts_its_own_assignments_until_the_next_snapshot():
    lb = DPLoadBalancer(2)
    lb.assign(), lb.assign(), lb.assign()  # ranks 0, 1, 0
    lb.finished(0), lb.finished(0)
    assert lb.assign() == 1  # rank 0's two local waiting bumps still count


def test_balancer_penalises_a_queue_on_a_full_kv_cache():
    lb = DPLoadBalancer(2)
    lb.loads[0].waiting, lb.loads[0].kv_usage, lb.loads[0].in_flight = 2, 0.95, 2
    lb.loads[1].running, lb.loads[1].in_flight = 3, 3
    assert lb.assign() == 1  # 2 + 2 x 6 x 0.45 > 3


# ---- imported runs ----
def test_import_reads_the_recorded_layout_and_block_count_per_engine(tmp_path):
    kwargs = {"model": "Qwen/Qwen3-30B-A3B", "tensor_parallel_size": 1, "data_parallel_size": 2,
              "enable_expert_parallel": True, "max_num_seqs": 8, "max_num_batched_tokens": 64, "dtype": "bfloat16"}
    run = make_run(tmp_path, engine_kwargs=kwargs, kv_cache={"num_gpu_blocks": 60000, "block_size": 16})
    assert import_run(run, tmp_path / "t") == 0
    meta = traces.load(tmp_path / "t").meta
    assert meta["config"]["parallel"] == {"tensor_parallel_size": 1, "data_parallel_size": 2,
                                          "enable_expert_parallel": True}
    assert meta["config"]["cache"]["num_gpu_blocks"] == 30000
    assert "/ 2 data-parallel engines" in meta["import"]["resolved_from"]["cache.num_gpu_blocks"]


def test_import_prefers_the_resolved_config_over_vllm_defaults(tmp_path):
    resolved = {"scheduler_config": {"long_prefill_token_threshold": 128, "async_scheduling": False},
                "model_config": {"dtype": "torch.bfloat16", "hf_config": "<Qwen3MoeConfig>"}}
    run = make_run(tmp_path, resolved_config=resolved)
    assert import_run(run, tmp_path / "t") == 0
    meta = traces.load(tmp_path / "t").meta
    assert meta["config"]["scheduler"]["long_prefill_token_threshold"] == 128
    assert meta["config"]["scheduler"]["async_scheduling"] is False
    assert "scheduler.async_scheduling" not in meta["import"]["inferred"]


def test_import_of_a_resolved_config_that_is_not_an_object_is_one_line(tmp_path, capsys):
    run = make_run(tmp_path, resolved_config="oops")
    assert import_run(run, tmp_path / "t") == 2
    assert "resolved_config" in capsys.readouterr().err


@needs_data
def test_replay_of_an_imported_data_parallel_run_takes_its_layout_from_the_run(tmp_path):
    kwargs = {"model": "Qwen/Qwen3-30B-A3B", "tensor_parallel_size": 1, "data_parallel_size": 2,
              "enable_expert_parallel": True, "max_num_seqs": 8, "max_num_batched_tokens": 64, "dtype": "bfloat16"}
    run = make_run(tmp_path, engine_kwargs=kwargs)
    assert import_run(run, tmp_path / "t") == 0
    from sim.cli import main

    assert main(["replay", str(tmp_path / "t"), "--model", str(QWEN3_MOE), "--hardware", "rtx-pro-6000",
                 "--cost-model", str(BUNDLE), "--trace", str(tmp_path / "r"), "--no-progress"]) == 0
    sim = traces.load(tmp_path / "r")
    assert sim.meta["config"]["parallel"]["data_parallel_size"] == 2
    assert sim.meta["cluster"]["replicas"] == 2 and "replica" in sim.requests.columns


def test_replay_sizes_the_kv_cache_from_the_run_s_recorded_kv_cache_bytes(tmp_path):
    run = make_run(tmp_path, engine_kwargs={"model": "meta-llama/Llama-3.1-8B", "max_num_seqs": 8,
                                            "max_num_batched_tokens": 64, "kv_cache_memory_bytes": 1 << 30})
    assert import_run(run, tmp_path / "t") == 0
    from sim.cli import main

    assert main(["replay", str(tmp_path / "t"), "--model", "llama-3.1-8b", "--hardware", "h100",
                 "--trace", str(tmp_path / "r"), "--no-progress"]) == 0
    per_block = 16 * model_shape("llama-3.1-8b").kv_bytes_per_token
    assert traces.load(tmp_path / "r").meta["kv_cache"]["num_blocks"] == (1 << 30) // per_block


def test_a_recorded_replay_refuses_a_layout_the_trace_did_not_run(tmp_path, capsys):
    from sim.cli import main

    run = make_run(tmp_path)
    assert import_run(run, tmp_path / "t") == 0
    assert main(["replay", str(tmp_path / "t"), "--cost-model", "recorded", "--data-parallel-size", "2",
                 "--trace", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "--data-parallel-size 2: the recorded cost model prices the layout it measured" in capsys.readouterr().err


def test_an_idle_group_runs_dummy_batches_until_its_32_step_idle_check():
    cost = _Priced()
    _cluster(cost, pad=False).run([_request(0, 10, 2)])  # 2 steps of work, then dummies to step 32
    assert len(cost.batches) == 2 * 32

