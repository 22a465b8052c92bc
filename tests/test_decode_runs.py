"""Decode runs (sim.core.decode_runs) are invisible in the result: a replay that advances decode-only stretches
as runs writes every trace table exactly as the step-by-step loop does, for generated workloads and
replayed traces (stop tokens), with and without prefix caching, through preemptions, and at every trace
level; and on a decode-heavy replay most steps do go through runs."""
import pyarrow.parquet as pq
import pytest

from engine.core.config import CacheConfig, SchedulerConfig
from sim.cost_models.base import CostModelInfo, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cost_models.roofline import RooflineCostModel
from sim.core.simulator import Simulator
from sim.core.sources import open_source
from workloads import DEFAULT_WORKLOAD
from sim.cost_models.base import CostModelDefaults

TABLES = ("steps", "decisions", "block_events", "block_snapshots", "requests")


class ContextCost(CostModelDefaults):
    """Step time that grows with the context read, so a run's per-step batch shape shows in the clock."""

    name = "context"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.004 + 1e-5 * batch.num_tokens + 3e-7 * batch.context_tokens + 1e-4 * batch.num_seqs)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


def _replay(out, source, sched, cache, decode_runs, trace_level="full", snapshot_every=None, time_scale=0.3,
            cost=None):
    src = open_source(str(source), limit=60, time_scale=time_scale)
    sim = Simulator(sched, cache, cost or ContextCost(), out, trace_level=trace_level, decode_runs=decode_runs,
                    snapshot_every=snapshot_every)
    result = sim.run(src.requests, external_finishes=src.external_finishes)
    tables = {t: pq.read_table(out / f"{t}.parquet") for t in TABLES if (out / f"{t}.parquet").exists()}
    return tables, sim, result


def _assert_same_trace(tmp_path, source, sched, cache, **kw):
    runs, sim, _ = _replay(tmp_path / "runs", source, sched, cache, True, **kw)
    plain, _, _ = _replay(tmp_path / "plain", source, sched, cache, False, **kw)
    assert runs.keys() == plain.keys()
    for name in runs:
        assert runs[name].equals(plain[name]), name
    return sim


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("time_scale", [0.3, 3.0])
def test_runs_write_the_step_by_step_trace(tmp_path, prefix_caching, time_scale):
    """Arrivals close together (runs cut short, prefills interleaved) and spread out (long runs)."""
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512)
    cache = CacheConfig(block_size=16, num_gpu_blocks=400, enable_prefix_caching=prefix_caching)
    sim = _assert_same_trace(tmp_path, DEFAULT_WORKLOAD, sched, cache, snapshot_every=50, time_scale=time_scale)
    assert sim.replica.runs.num_steps > 0


@pytest.mark.parametrize("num_gpu_blocks,time_scale", [(400, 0.3), (400, 3.0), (90, 0.3)])
def test_runs_timed_at_once_write_the_step_by_step_trace(tmp_path, num_gpu_blocks, time_scale):
    """The roofline times a run's steps in one call (decode_step_times): the run visits only its block
    crossings and snapshots, and stops where the pool runs short (90 blocks: preemptions)."""
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=256)
    cache = CacheConfig(block_size=16, num_gpu_blocks=num_gpu_blocks)
    roofline = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="l4")
    sim = _assert_same_trace(tmp_path, DEFAULT_WORKLOAD, sched, cache, snapshot_every=50, time_scale=time_scale,
                             cost=roofline)
    assert sim.replica.runs.num_runs_at_once > 0 and sim.replica.runs.num_steps > 0


def test_most_steps_of_a_decode_heavy_replay_go_through_runs(tmp_path):
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512)
    _, sim, _ = _replay(tmp_path / "runs", DEFAULT_WORKLOAD, sched, CacheConfig(block_size=16, num_gpu_blocks=400),
                        True, time_scale=3.0)
    assert sim.replica.runs.num_steps > 0.8 * sim.replica.recorder.num_steps


def test_runs_write_the_step_by_step_trace_through_preemptions(tmp_path):
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=256)
    cache = CacheConfig(block_size=16, num_gpu_blocks=90)
    runs, sim, _ = _replay(tmp_path / "check", DEFAULT_WORKLOAD, sched, cache, True)
    assert sum(runs["steps"].column("num_preempted").to_pylist()) > 0  # the pool is short enough to preempt
    assert sim.replica.runs.num_steps > 0
    _assert_same_trace(tmp_path, DEFAULT_WORKLOAD, sched, cache)


@pytest.mark.parametrize("trace_level", ["steps", "none"])
def test_runs_write_the_step_by_step_trace_at_lower_trace_levels(tmp_path, trace_level):
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512)
    cache = CacheConfig(block_size=16, num_gpu_blocks=400)
    _assert_same_trace(tmp_path, DEFAULT_WORKLOAD, sched, cache, trace_level=trace_level)


def test_runs_stop_where_a_replayed_request_samples_its_stop_token(tmp_path):
    """A replayed trace feeds back its requests' tokens, and those that stopped end on their EOS: the
    run must hand the step with that token to the loop, which applies the stop rules."""
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=512)
    cache = CacheConfig(block_size=16, num_gpu_blocks=400)
    source, _, _ = _replay(tmp_path / "source", DEFAULT_WORKLOAD, sched, cache, True)
    requests = source["requests"].to_pandas()
    # Mark a third of the source's requests as stopped on their last token, as an EOS ends a real run.
    # Their max_tokens grows, so only the stop token can end them where they ended.
    stopped = (requests.index % 3 == 0) & (requests["finish_reason"] == "length")
    requests.loc[stopped, "finish_reason"] = "stop"
    requests.loc[stopped, "max_tokens"] += 40
    requests.to_parquet(tmp_path / "source" / "requests.parquet")
    replayed, sim, _ = _replay(tmp_path / "replayed", tmp_path / "source", sched, cache, True)
    ends = replayed["requests"].to_pandas().set_index("request_id").loc[requests.loc[stopped, "request_id"]]
    assert (ends["finish_reason"] == "stop").all()
    assert ends["num_output_tokens"].tolist() == requests.loc[stopped, "num_output_tokens"].tolist()
    _assert_same_trace(tmp_path / "both", tmp_path / "source", sched, cache)


@pytest.mark.parametrize("trace_level", ["full", "steps"])
def test_runs_write_the_step_by_step_trace_while_requests_wait_behind_taken_seats(tmp_path, trace_level):
    """Four seats and a queue: most steps decode while requests wait, which runs take as well."""
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=4, max_num_batched_tokens=512)
    cache = CacheConfig(block_size=16, num_gpu_blocks=400)
    sim = _assert_same_trace(tmp_path, DEFAULT_WORKLOAD, sched, cache, snapshot_every=50, trace_level=trace_level)
    steps = pq.read_table(tmp_path / "runs" / "steps.parquet").to_pandas()
    blocked = steps[(steps["admission_blocked"] == "max_num_seqs") & (steps["num_prefill_tokens"] == 0)]
    assert len(blocked) > len(steps) / 2
    assert sim.replica.runs.num_steps > 0.8 * len(blocked)
