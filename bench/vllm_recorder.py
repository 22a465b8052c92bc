"""Overhead of recording real vLLM: step time of vLLM-CPU on the built-in model with the stepscope
recording scheduler (trace written every step) against vLLM's own Scheduler, same batch of requests.

Both engines live in this process and take turns, repeat after repeat, so load on the machine hits
both alike; each repeat gives the median `LLMEngine.step()` time of each, and the figures are the
medians over repeats. `recorder_per_step` is the recorder's own time (its hooks and the trace write),
measured inside the same runs.

    python bench/vllm_recorder.py [--requests 16] [--max-tokens 48] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _engine_kwargs(model_dir: str) -> dict:
    return dict(model=model_dir, max_model_len=512, block_size=32, max_num_seqs=8, max_num_batched_tokens=256,
                enforce_eager=True, dtype="float32", gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20,
                disable_log_stats=True)


def _timed_hooks(recorder, spent: list[float]) -> None:
    """Accumulate the time the recorder's step hooks take into spent[0] (and count steps in spent[1])."""
    for name in ("on_schedule", "on_update"):
        fn = getattr(recorder, name)

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t = time.perf_counter()
            out = _fn(*args, **kwargs)
            spent[0] += time.perf_counter() - t
            spent[1] += _name == "on_update"
            return out

        setattr(recorder, name, timed)


def _run(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    import random

    from vllm import EngineArgs, LLMEngine

    from engine.vllm_backend.checkpoint import save_builtin_checkpoint
    from engine.vllm_backend.runner import build_vllm_engine

    tmp = tempfile.TemporaryDirectory(prefix="stepscope-bench-vllm-")
    model_dir = str(save_builtin_checkpoint(os.path.join(tmp.name, "model")))
    off = LLMEngine.from_engine_args(EngineArgs(**_engine_kwargs(model_dir)))
    on = build_vllm_engine({**_engine_kwargs(model_dir),
                            "scheduler_cls": "engine.vllm_backend.scheduler.RecordingScheduler"},
                           os.path.join(tmp.name, "trace"))
    spent = [0.0, 0]
    _timed_hooks(on.scheduler.stepscope, spent)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(rng.randrange(32, 160))] for _ in range(args.requests)]
    _run(off, prompts, 4, "warm-off")
    _run(on.engine, prompts, 4, "warm-on")
    spent[:] = [0.0, 0]
    med_off, med_on = [], []
    for r in range(args.repeats):
        order = [("off", off), ("on", on.engine)] if r % 2 == 0 else [("on", on.engine), ("off", off)]
        for name, engine in order:
            (med_off if name == "off" else med_on).append(_run(engine, prompts, args.max_tokens, f"{name}{r}"))
    on.scheduler.close_trace()
    step_off, step_on = statistics.median(med_off), statistics.median(med_on)
    print(f"requests: {args.requests} x {args.max_tokens} tokens, {args.repeats} repeats (medians)")
    print(f"step_time_off: {step_off * 1e3:.3f} ms")
    print(f"step_time_on: {step_on * 1e3:.3f} ms")
    print(f"recorder_per_step: {spent[0] / max(spent[1], 1) * 1e6:.1f} us")
    print(f"ratio: {step_on / step_off:.3f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
