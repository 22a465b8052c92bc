"""Async scheduling in the live engine overlaps for real: step k+1 is scheduled and prepared while step
k runs (a worker thread on the CPU, the stream on CUDA), with the synchronous engine's tokens; a step
that fails while another is in flight still ends exactly its own requests."""
import time

import pytest

import traces
from engine import LLM, SamplingParams
from engine.core.sampling_params import SamplingParams as CoreParams
from engine.engine_core import EngineCoreRequest

PROMPTS = [{"prompt_token_ids": [5, 17, 42, 8, 9]}, {"prompt_token_ids": [11, 12] * 9}, "Hello",
           {"prompt_token_ids": list(range(3, 40))}]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_k=40, seed=7, logprobs=2, min_tokens=4)
MODES = ("thread", "launch", "none")


def _core(llm):
    return llm.llm_engine.engine_core.engine_core


def _runner(llm):
    return _core(llm).executor.driver_worker.model_runner


def _llm(async_scheduling: bool, mode: str | None = None, **kw) -> LLM:
    kw = {"max_num_seqs": 3, "max_num_batched_tokens": 16, "max_model_len": 128, **kw}
    llm = LLM(device="cpu", async_scheduling=async_scheduling, **kw)
    if mode is not None:
        _core(llm).set_step_overlap(mode)
    return llm


def _outputs(llm, params) -> list:
    """Tokens, and per position the top logprobs: {id: value}."""
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs or []) for o in outs]


def _assert_same_outputs(got: list, expected: list, mode: str) -> None:
    """The same tokens and the same top logprob ids; values equal but for their last bits, which batches
    that differ (one more preemption under async) move, as they do in vLLM. Rounding both sides instead
    would fail whenever a one-ulp difference straddles a rounding boundary."""
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected], mode
    for (_, lps), (_, want) in zip(got, expected):
        assert [set(d) for d in lps] == [set(d) for d in want], mode
        for d, w in zip(lps, want):
            assert all(abs(d[t] - w[t]) <= 1e-5 for t in w), (mode, d, w)


def test_cpu_async_defaults_to_the_cuda_code_path():
    """On a CPU the worker thread measured slower (the GIL), so async runs the CUDA launch path there."""
    assert _runner(_llm(True)).step_overlap == "launch" and _runner(_llm(False)).step_overlap == "none"
    with pytest.raises(ValueError):
        _runner(_llm(False)).set_step_overlap("overlap")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_every_step_overlap_gives_the_synchronous_tokens(params):
    """Chunked prefills, preemptions (9 usable blocks of 8 tokens) and logprobs; the decode inputs that
    async steps take from the previous step's sampled ids on the device must be the tokens sync feeds."""
    small = dict(num_gpu_blocks_override=10, block_size=8, max_model_len=64)
    sync = _llm(False, **small)
    expected = _outputs(sync, params)
    assert _core(sync).num_preemptions > 0
    for mode in MODES:
        llm = _llm(True, mode, **small)
        _assert_same_outputs(_outputs(llm, params), expected, mode)
        assert _core(llm).num_preemptions > 0 and len(_runner(llm)._pending) == len(_core(llm).cycle.in_flight)


def _slow_down(llm, forward_s: float, schedule_s: float, log: list) -> None:
    """Make the forward and the scheduler each take a while (sleeping, so the GIL is free) and log when."""
    model, sched = _runner(llm).model, _core(llm).scheduler
    real_forward, real_schedule = model.forward, sched.schedule

    def timed(name, fn, delay):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            time.sleep(delay)
            out = fn(*args, **kwargs)
            log.append((name, t0, time.perf_counter()))
            return out
        return call

    model.forward = timed("forward", real_forward, forward_s)
    sched.schedule = timed("schedule", real_schedule, schedule_s)


def _run_slowed(tmp_path, async_scheduling: bool) -> tuple[list, traces.Trace]:
    path = tmp_path / ("async" if async_scheduling else "sync")
    llm = _llm(async_scheduling, "thread" if async_scheduling else None, trace=str(path))
    log: list = []
    _slow_down(llm, 0.04, 0.015, log)
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    return log, traces.load(path)


def _schedules_during_forwards(log: list) -> int:
    """Scheduler calls that spent at least half their time while a forward was running."""
    forwards = [(a, b) for name, a, b in log if name == "forward"]
    return sum(sum(max(0.0, min(b, fb) - max(a, fa)) for fa, fb in forwards) >= (b - a) / 2
               for name, a, b in log if name == "schedule")


def _overlapping_steps(trace: traces.Trace) -> int:
    """Steps whose schedule span lies inside the previous step's execute span."""
    spans = trace.spans
    steps = spans[spans["name"] == "step"].sort_values("start")
    child = {(r.parent_span_id, r.name): (r.start, r.end) for r in spans.itertuples() if r.name != "step"}
    phases = [(child[(s, "schedule")], child.get((s, "execute"))) for s in steps["span_id"]]
    return sum(ex is not None and ex[0] <= sch[0] and sch[1] <= ex[1]
               for (_, ex), (sch, _) in zip(phases, phases[1:]))


def test_thread_overlap_schedules_the_next_step_while_the_forward_runs(tmp_path):
    """Wall time is the benchmark's business (bench/async_scheduling.py); here the timeline is checked."""
    sync_log, sync_trace = _run_slowed(tmp_path, False)
    async_log, async_trace = _run_slowed(tmp_path, True)
    assert sync_trace.meta["step_overlap"] == "none" and async_trace.meta["step_overlap"] == "thread"
    assert _schedules_during_forwards(sync_log) == 0 and _overlapping_steps(sync_trace) == 0
    # Real overlap: the scheduler ran while the worker thread was inside a forward, step after step.
    assert _schedules_during_forwards(async_log) >= 4
    assert _overlapping_steps(async_trace) >= 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["forward", "sampler"])
def test_a_failing_overlapped_step_ends_exactly_its_requests(mode, where):
    """Request A's second step fails while the step after it, which B's prefill joined, is in flight:
    A ends with the error, B gets the tokens it gets alone."""
    b_prompt = list(range(30, 45))
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    alone = _llm(True, mode).generate([{"prompt_token_ids": b_prompt}], params, use_tqdm=False)[0]
    llm = _llm(True, mode)
    core, runner = _core(llm), _runner(llm)
    target = runner.model if where == "forward" else runner.sampler
    real, calls = target.forward, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    target.forward = flaky

    def request(rid, prompt):
        return EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, eos_token_id=None, arrival_time=0.0,
                                 sampling_params=CoreParams(max_tokens=10, temperature=0.0, ignore_eos=True))

    core.add_request(request("A", [5, 6, 7, 8]))
    tokens, finish, errors = {}, {}, {}
    for i in range(60):
        if i == 2:  # A's failing step is launched; B joins the next one
            core.add_request(request("B", b_prompt))
        for out in core.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finish[out.request_id], errors[out.request_id] = out.finish_reason, out.stop_reason
        if not core.has_work():
            break
    assert finish == {"A": "error", "B": "length"}
    assert tokens["B"] == alone.outputs[0].token_ids
    assert core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == \
        core.scheduler.kv_cache_manager.block_pool.num_usable_blocks
