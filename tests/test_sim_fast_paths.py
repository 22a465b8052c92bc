"""The simulator's fast paths give what the plain per-row code gives: the same StepBatch for every step
(to the bit) and the same sampled tokens, on runs that preempt, resume, chunk prefills and hit the prefix
cache, sync and async; the recorder's buffered rows equal its row-by-row ones, and a cluster stamps each
replica on its own rows."""
import pandas as pd
import pytest

import sim.core.stepping
import traces
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.sched_output import CachedRequestData, SchedulerOutput
from sim.cost_models.batch import StepBatch, batch_from_output
from sim.core.cluster import Cluster
from sim.core.simulator import Simulator
from sim.core.runner import FIRST_TOKEN_ID, FakeModelRunner
from sim.core.sources import open_source
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from workloads import DEFAULT_WORKLOAD
from sim_helpers import FixedCost




def reference_batch(so: SchedulerOutput) -> StepBatch:
    """Every scheduled row through StepBatch.add, in the scheduler output's order."""
    batch = StepBatch()
    tokens = so.num_scheduled_tokens
    for new in so.scheduled_new_reqs:
        batch.add(tokens[new.req_id], new.num_computed_tokens, False)
    cached = so.scheduled_cached_reqs
    for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
        batch.add(tokens[rid], computed, rid in so.decode_req_ids)
    return batch


def _run(tmp_path, monkeypatch, async_scheduling: bool, check) -> None:
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256,
                            async_scheduling=async_scheduling)
    cache = CacheConfig(block_size=16, num_gpu_blocks=120)
    seen = []

    def checked(so: SchedulerOutput) -> StepBatch:
        batch = batch_from_output(so)
        check(so, batch)
        seen.append(so)
        return batch

    monkeypatch.setattr(sim.core.stepping, "batch_from_output", checked)
    Simulator(sched, cache, FixedCost(), tmp_path / "trace").run(
        open_source(str(DEFAULT_WORKLOAD), limit=60, time_scale=0.2).requests)
    return seen


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_batch_from_output_equals_the_per_row_batch_on_every_step(tmp_path, monkeypatch, async_scheduling):
    def check(so, batch):
        ref = reference_batch(so)
        assert batch == ref
        assert repr(batch.prefill_attention) == repr(ref.prefill_attention)  # same bits, not merely close

    seen = _run(tmp_path, monkeypatch, async_scheduling, check)
    cached = [so.scheduled_cached_reqs for so in seen]
    # The run covers every kind of row: resumed after preemption, chunked prefill, plain decode, new.
    assert any(any(c.resumed_from_preemption) for c in cached)
    assert any(len(c.req_ids) > len(so.decode_req_ids) for c, so in zip(cached, seen))
    assert any(so.decode_req_ids for so in seen) and any(so.scheduled_new_reqs for so in seen)


def reference_tokens(runner: FakeModelRunner, so: SchedulerOutput, requests) -> list[list[int]]:
    """Each scheduled request's sampled token by the documented rule, one request at a time."""
    out = []
    for rid in so.num_scheduled_tokens:
        req = requests[rid]
        if req.is_prefill_chunk:
            out.append([])
            continue
        pos = req.num_computed_tokens - len(req.prompt_token_ids)
        rec = runner._recorded.get(rid)
        out.append([rec[pos]] if rec is not None and pos < len(rec)
                   else [FIRST_TOKEN_ID + (runner._base[rid] + pos * 2654435761) % runner.span])
    return out


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_fake_runner_samples_the_documented_tokens(tmp_path, monkeypatch, async_scheduling):
    sampled_steps = []
    execute = FakeModelRunner.execute

    def checked(self, so, requests):
        out = execute(self, so, requests)
        assert out.req_ids == list(so.num_scheduled_tokens)
        assert out.sampled_token_ids == reference_tokens(self, so, requests)
        sampled_steps.append(sum(map(len, out.sampled_token_ids)))
        return out

    monkeypatch.setattr(FakeModelRunner, "execute", checked)
    _run(tmp_path, monkeypatch, async_scheduling, lambda so, batch: None)
    assert sum(sampled_steps) > 100 and 0 in sampled_steps


def test_fake_runner_feeds_recorded_tokens_then_hashed_ones():
    requests = {}
    runner = FakeModelRunner(seed=1, requests=requests)
    runner.register("a", [50, 51])
    runner.register("b")
    for rid in ("a", "b"):
        req = Request(rid, [5, 6, 7], SamplingParams(max_tokens=8))
        req.num_computed_tokens = 3
        requests[rid] = req
    so = SchedulerOutput([], CachedRequestData(), {"a": 1, "b": 1}, 2, set())
    for _ in range(3):
        assert runner.execute(so, requests).sampled_token_ids == reference_tokens(runner, so, requests)
        for req in requests.values():
            req.num_computed_tokens += 1
    assert runner.execute(so, requests).sampled_token_ids[0] != [51]  # past the recorded ones: hashed


@pytest.mark.parametrize("count", [2, 40])  # 6 x 2 tokens drawn in Python, 6 x 40 in one numpy expression
@pytest.mark.parametrize("recorded", [False, True])
def test_upcoming_tokens_are_those_the_runner_samples_step_by_step(count, recorded):
    """A decode run's tokens drawn ahead (`upcoming`) are the ones `execute` samples at each position."""
    requests = {}
    runner = FakeModelRunner(seed=3, vocab_size=1 << 20, requests=requests)
    for i in range(6):
        rid = f"r{i}"
        # Recorded requests start inside their 8 recorded tokens: 40 steps run past them into hashed ones.
        runner.register(rid, [60 + k for k in range(8)] if recorded and i % 2 else None)
        req = Request(rid, [5, 6, 7], SamplingParams(max_tokens=1000))
        req.output_token_ids.extend(range(i))  # each at its own output position
        requests[rid] = req
    ahead = runner.upcoming(list(requests.values()), count)
    so = SchedulerOutput([], CachedRequestData(), dict.fromkeys(requests, 1), len(requests), set())
    stepped = []
    for j in range(count):
        for req in requests.values():
            req.num_computed_tokens = len(req.prompt_token_ids) + len(req.output_token_ids) + j
        stepped.append([t for (t,) in runner.execute(so, requests).sampled_token_ids])
    assert ahead == [list(column) for column in zip(*stepped)]


class RowsOnlyWriter:
    """A writer that takes only dict rows: the recorder's fallback path, none of the shared buffers."""

    columnar = False

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer

    def write_rows(self, table, rows):
        self.writer.write_rows(table, rows)

    def update_meta(self, **fields):
        self.writer.update_meta(**fields)

    def flush(self, steps=1):
        self.writer.flush(steps)

    def close(self, **meta):
        self.writer.close(**meta)


def test_rows_only_writer_gets_the_same_trace_as_the_buffered_one(tmp_path, monkeypatch):
    class RowsOnlySimulator(Simulator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.replica.attach(TraceRecorder(RowsOnlyWriter(self.cluster.writer), self.replica.scheduler,
                                              snapshot_every=self.replica.recorder.snapshot_every))

    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256)
    cache = CacheConfig(block_size=16, num_gpu_blocks=120)
    for cls, name in ((Simulator, "buffered"), (RowsOnlySimulator, "rows")):
        cls(sched, cache, FixedCost(), tmp_path / name).run(
            open_source(str(DEFAULT_WORKLOAD), limit=40, time_scale=0.2).requests)
    a, b = traces.load(tmp_path / "buffered"), traces.load(tmp_path / "rows")
    assert a.steps["admission_blocked"].notna().any() and (a.decisions["event"] == "preempt").any()
    for table in ("steps", "decisions", "block_events", "requests"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_dtype=False)


def test_cluster_stamps_each_replica_on_its_own_rows(tmp_path):
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256)
    cache = CacheConfig(block_size=16, num_gpu_blocks=120)
    Cluster(3, sched, cache, FixedCost(), "round_robin", trace_dir=tmp_path / "t").run(
        open_source(str(DEFAULT_WORKLOAD), limit=60, time_scale=0.2).requests)
    t = traces.load(tmp_path / "t")
    step_replica = t.steps.set_index("step")["replica"]
    assert sorted(step_replica.unique()) == [0, 1, 2]
    for table in (t.decisions, t.block_events):
        assert table["replica"].notna().all()
        assert (table["replica"].to_numpy() == step_replica.loc[table["step"]].to_numpy()).all()
    assert t.steps["admission_blocked"].notna().any()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_runner_forgets_every_request_that_ended(tmp_path, async_scheduling):
    """The sync loop forgets finished requests from the scheduler's finished ids, not by walking every
    output: at the end nothing is left registered, rejected requests included."""
    sched = SchedulerConfig(max_model_len=600, max_num_seqs=8, max_num_batched_tokens=256,
                            async_scheduling=async_scheduling)
    sim = Simulator(sched, CacheConfig(block_size=16, num_gpu_blocks=120), FixedCost(), tmp_path / "trace")
    result = sim.run(open_source(str(DEFAULT_WORKLOAD), limit=40, time_scale=0.2).requests)
    trace = traces.load(tmp_path / "trace")
    assert result.num_requests == 40 and trace.requests["finish_reason"].notna().all()
    assert (trace.requests["finish_reason"] == "error").any()  # prompts past max_model_len are rejected
    assert sim.replica.runner._base == {} and sim.replica.runner._recorded == {}


def test_copies_of_a_request_take_its_prompt_hashes_from_the_first_without_hashing_again(monkeypatch):
    import dataclasses

    import engine.core.request as request_module
    from sim.core.sources import SimRequest, make_request

    first = SimRequest(request_id="r", arrival=0.0, prompt_token_ids=list(range(100, 200)), max_tokens=4,
                       add_time=0.0, prompt_block_hashes={})
    fresh = make_request(dataclasses.replace(first, prompt_block_hashes=None), 16)
    assert make_request(first, 16).block_hashes == fresh.block_hashes and first.prompt_block_hashes[16]

    def no_hashing(*args):
        raise AssertionError("hashed again")

    monkeypatch.setattr(request_module, "hash_blocks", no_hashing)
    assert make_request(dataclasses.replace(first, arrival=5.0), 16).block_hashes == fresh.block_hashes
