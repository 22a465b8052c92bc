"""Async scheduling on CUDA (run by bench/gpu_check.sh; skipped without a GPU): the runner launches
forward and sampling on the stream and returns, so step k+1 is scheduled and launched while the device
still runs step k; its decode inputs come from step k's sampled ids on the device; the tokens are the
synchronous engine's."""
import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PROMPTS = [{"prompt_token_ids": [5, 17, 42, 8, 9]}, {"prompt_token_ids": [11, 12] * 9}, "Hello",
           {"prompt_token_ids": list(range(3, 40))}]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_k=40, seed=7, logprobs=2, min_tokens=4)


def _core(llm):
    return llm.llm_engine.engine_core.engine_core


def _runner(llm):
    return _core(llm).executor.driver_worker.model_runner


def _llm(async_scheduling: bool, **kw) -> LLM:
    kw = {"max_num_seqs": 3, "max_num_batched_tokens": 16, "max_model_len": 64, "block_size": 8,
          "num_gpu_blocks_override": 10, "attention_backend": "triton", **kw}
    return LLM(device="cuda", dtype="float32", async_scheduling=async_scheduling, **kw)


def _outputs(llm, params) -> list:
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [{t: round(v, 3) for t, v in d.items()} for d in o.outputs[0].logprobs or []])
            for o in outs]


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_cuda_async_gives_the_synchronous_tokens(params, enforce_eager):
    expected = _outputs(_llm(False, enforce_eager=enforce_eager), params)
    llm = _llm(True, enforce_eager=enforce_eager)
    assert _runner(llm).step_overlap == "launch" and (_runner(llm).graphs is None) == enforce_eager
    assert _outputs(llm, params) == expected
    assert _core(llm).num_preemptions > 0
    torch.cuda.empty_cache()


def test_cuda_launches_the_next_step_before_the_device_finishes_this_one():
    """Each decode step is made to hold the device ~20 ms (a spin kernel ahead of the graph replay).
    When `execute_model` returns for step k+1, step k must still be running (the host did not wait), and
    no call in a decode step's execute may synchronise with the device."""
    llm = LLM(device="cuda", dtype="float32", attention_backend="triton", max_num_seqs=8, max_model_len=128,
              kv_cache_memory=64 << 20, async_scheduling=True)
    runner = _runner(llm)
    assert runner.graphs is not None
    real_run, real_execute = runner.graphs.run, runner.execute_model

    def slow_run(*args, **kwargs):
        torch.cuda._sleep(40_000_000)
        return real_run(*args, **kwargs)

    previous_still_running: list[bool] = []

    def checked_execute(so):
        decode_only = so.total_num_scheduled_tokens > 0 and so.num_prefill_tokens == 0
        torch.cuda.set_sync_debug_mode("error" if decode_only else "default")
        try:
            real_execute(so)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        pending = runner._pending
        if decode_only and len(pending) == 2 and pending[0].output is not None:
            previous_still_running.append(not pending[0].output.event.query())

    runner.graphs.run = slow_run
    runner.execute_model = checked_execute
    outs = llm.generate([{"prompt_token_ids": list(range(10 + i, 30 + i))} for i in range(6)],
                        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 6  # a sync in execute would be "error"
    assert len(previous_still_running) >= 8 and sum(previous_still_running) >= 0.8 * len(previous_still_running)
