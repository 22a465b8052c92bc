"""Overhead of recording real vLLM: step time of vLLM-CPU on the built-in model with the stepscope
recording scheduler writing its trace, against the same engine with recording switched off.

One engine, and recording switched on and off step by step (every other `LLMEngine.step()`, the phase
flipped each repeat): neighbouring steps carry nearly the same batch under the same machine load,
which whole runs on a shared machine do not (two engines in one process, or alternating whole runs,
gave step times 30-60 % apart either way). Off means the recorder is detached (the subclass calls vLLM's
methods straight through) and vLLM's own KV cache manager methods are back. The trace of such a run
misses every other step and is thrown away; the rows are written at twice vLLM's interval, so that each
write carries as many recorded steps as when every step is recorded.

Printed:
- `ratio`: the median over neighbouring (on, off) step pairs of on / off, with a bootstrap 90 %
  interval (the median of the pairs, not of each side: a pair shares the batch and the moment's load);
- `ratio_mean`: total on time / total off time over the pairs (a step that writes the pending rows
  counts in full here, where the median sees mostly the steps in between);
- `cpu_ratio`: the paired median on the process's CPU time, which other processes disturb less;
- `recorder_per_step`: the recorder's own time, timed directly around its hooks (the writes of pending
  rows included) and its KV cache manager wrappers (less vLLM's call inside), per recorded step (mean
  and median: the mean carries the steps that write), plus `on_add` (it runs in add_request, outside
  the timed steps), and `recorder_share`, all of it against the mean off step: the overhead without
  the neighbouring-step noise;
- `gc_per_step`: Python's garbage collector's time in on and off steps (the recorder's objects wait
  for the next write), which the direct timing does not see;
- `timing_floor`: what one timed call costs the bench itself, timed in place (a timed no-op each step),
  times the timed calls per recorded step: that much of recorder_per_step, and of every on step, is
  the measurement's, not the recorder's;
- `noise`: whether the ratio's interval is narrower than that share, i.e. whether the ratio can tell the
  recorder from noise at all (on 2 shared cores it mostly cannot: then recorder_share is the figure).

`--control` runs the same pairs with recording off on both sides: the ratios' bias and spread when there
is nothing to measure (a ratio away from 1.000 there is the bench's, not the recorder's).

    python bench/vllm_recorder.py [--requests 16] [--max-tokens 48] [--repeats 10] [--profile] [--control]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

HOOKS = ("on_add", "on_schedule", "on_execute_end", "on_update", "on_abort")
KV_METHODS = ("allocate_slots", "cache_blocks", "free")
PROBE = " probe"  # a timed no-op; names starting with a space are not the recorder's time


def _engine_kwargs(model_dir: str) -> dict:
    return dict(model=model_dir, max_model_len=512, block_size=32, max_num_seqs=8, max_num_batched_tokens=256,
                enforce_eager=True, dtype="float32", gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20,
                disable_log_stats=True)


class _Timer:
    """The recorder's own time: its hooks, and its KV wrappers less the vLLM method each one calls."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, list[float]] = defaultdict(list)  # each call's time, for --profile's medians
        self.inner = 0.0  # time inside vLLM's own KV cache manager methods, so far

    def reset(self) -> None:
        self.spent.clear()
        self.calls.clear()

    def total(self) -> float:
        return sum(s for name, s in self.spent.items() if not name.startswith(" "))

    def own(self, fn, name: str):
        def timed(*args, **kwargs):
            inner, t = self.inner, time.perf_counter()
            out = fn(*args, **kwargs)
            spent = time.perf_counter() - t - (self.inner - inner)
            self.spent[name] += spent
            self.calls[name].append(spent)
            return out
        return timed

    def vllm(self, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.inner += time.perf_counter() - t
            return out
        return timed


def _time_kv_methods(timer: _Timer) -> None:
    """vLLM's KV cache manager methods, timed at the class, before the recorder wraps an instance."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    for name in KV_METHODS:
        setattr(KVCacheManager, name, timer.vllm(getattr(KVCacheManager, name)))


def _time_recorder(recorder, manager, timer: _Timer) -> None:
    for name in HOOKS:
        setattr(recorder, name, timer.own(getattr(recorder, name), name))
    for name in ("flush", "_write_step"):
        if hasattr(recorder, name):  # inside on_update: counted there, broken out for --profile
            setattr(recorder, name, timer.own(getattr(recorder, name), f"  {name} (in on_update)"))
    for name in KV_METHODS:
        setattr(manager, name, timer.own(getattr(manager, name), f"kv {name}"))
    # The timing's own cost, in place: a timed call of nothing once per step, next to a real hook (a
    # loop of them elsewhere runs on warm caches and reads several times lower).
    probe, hook = timer.own(lambda *args: None, PROBE), recorder.on_execute_end

    def on_execute_end(*args):
        probe()
        return hook(*args)

    recorder.on_execute_end = on_execute_end


class _GcClock:
    """Seconds spent in Python's garbage collector so far: the recorder's objects (held until the
    next write) make collections more frequent, and they cost wherever they happen to run."""

    def __init__(self) -> None:
        import gc

        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start


class _Switch:
    """Recording on or off for one engine whose scheduler is a RecordingScheduler."""

    def __init__(self, scheduler) -> None:
        self.scheduler, self.recorder = scheduler, scheduler.stepscope
        manager = scheduler.kv_cache_manager
        self.manager = manager
        self.wrapped = {n: getattr(manager, n) for n in KV_METHODS}

    def set(self, on: bool) -> None:
        self.scheduler.stepscope = self.recorder if on else None
        for name, fn in self.wrapped.items():
            if on:
                setattr(self.manager, name, fn)
            else:
                self.manager.__dict__.pop(name, None)


def _run(engine, prompts: list[list[int]], max_tokens: int, tag: str, switch: _Switch, phase: int = 0,
         pairs: list[tuple[float, float, float, float]] | None = None, timer: _Timer | None = None,
         own: list[float] | None = None, control: bool = False, gc_clock: _GcClock | None = None,
         gc_time: dict[bool, list[float]] | None = None) -> None:
    """All prompts to completion, recording on for steps of parity `phase`; appends (on, off, cpu on,
    cpu off) for each neighbouring pair of steps to `pairs`, the recorder's own time in each recorded
    step to `own` and each step's garbage collection time to `gc_time[on]`. `control`: the "on" steps
    run with recording off too."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)
    k = 0
    held: tuple[bool, float, float] | None = None
    while engine.has_unfinished_requests():
        on = k % 2 == phase
        switch.set(on and not control)
        before = timer.total() if timer is not None else 0.0
        collected = gc_clock.total if gc_clock is not None else 0.0
        t, c = time.perf_counter(), time.process_time()
        engine.step()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        if gc_time is not None:
            gc_time[on].append(gc_clock.total - collected)
        if on and own is not None:
            own.append(timer.total() - before)
        if held is None:
            held = (on, wall, cpu)
        else:
            first = held
            a, b = (first, (on, wall, cpu)) if first[0] else ((on, wall, cpu), first)
            if pairs is not None:
                pairs.append((a[1], b[1], a[2], b[2]))
            held = None
        k += 1
    switch.set(True)


def _paired_median(on, off, seed: int = 0) -> tuple[float, float, float]:
    """Median of on/off per pair and its bootstrap 90 % interval."""
    import numpy as np

    r = np.asarray(on) / np.asarray(off)
    rng = np.random.default_rng(seed)
    boots = np.median(r[rng.integers(0, len(r), (2000, len(r)))], axis=1)
    return float(np.median(r)), float(np.percentile(boots, 5)), float(np.percentile(boots, 95))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--profile", action="store_true", help="also print the recorder's time per hook")
    p.add_argument("--control", action="store_true",
                   help="recording off on both sides of every pair: the ratios' bias and spread without a recorder")
    args = p.parse_args()

    import random

    from engine.vllm_backend.checkpoint import save_builtin_checkpoint
    from engine.vllm_backend.runner import build_vllm_engine

    load_before = os.getloadavg()[0]
    tmp = tempfile.TemporaryDirectory(prefix="stepscope-bench-vllm-")
    model_dir = str(save_builtin_checkpoint(os.path.join(tmp.name, "model")))
    timer = _Timer()
    _time_kv_methods(timer)
    adapter = build_vllm_engine({**_engine_kwargs(model_dir),
                                 "scheduler_cls": "engine.vllm_backend.scheduler.RecordingScheduler"},
                                os.path.join(tmp.name, "trace"))
    engine, sched = adapter.engine, adapter.scheduler
    _time_recorder(sched.stepscope, sched.kv_cache_manager, timer)
    switch = _Switch(sched)
    # Rows are written every flush_interval seconds of wall time, and only every other step is recorded
    # here: at twice the interval a write carries as many recorded steps as in a run recording them all
    # (at the interval itself each write's fixed cost would count twice per recorded step).
    sched.stepscope.flush_interval *= 2
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4000) for _ in range(rng.randrange(32, 160))] for _ in range(args.requests)]
    _run(engine, prompts, 4, "warm", switch)
    timer.reset()
    gc_clock = _GcClock()
    gc_time: dict[bool, list[float]] = {True: [], False: []}
    pairs: list[tuple[float, float, float, float]] = []
    own: list[float] = []
    for r in range(args.repeats):
        _run(engine, prompts, args.max_tokens, f"r{r}", switch, r % 2, pairs, timer, own, args.control,
             gc_clock, gc_time)
    sched.close_trace()
    on, off, cpu_on, cpu_off = map(list, zip(*pairs))
    ratio, lo, hi = _paired_median(on, off)
    cpu, cpu_lo, cpu_hi = _paired_median(cpu_on, cpu_off)
    recorded = len(own)
    per_step = statistics.fmean(own)
    # on_add runs in add_request, outside every timed step: spread over all steps (on and off alike).
    adds = timer.spent.get("on_add", 0.0) / (2 * len(pairs))
    share = 100 * (per_step + adds) / statistics.fmean(off)
    print(f"requests: {args.requests} x {args.max_tokens} tokens, {args.repeats} repeats, {len(pairs)} step pairs "
          f"(on, off){', CONTROL: recording off on both sides' if args.control else ''}; load (1 min) "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs")
    print(f"step_time_off: {statistics.median(off) * 1e3:.3f} ms (median), {statistics.fmean(off) * 1e3:.3f} ms (mean)")
    print(f"step_time_on: {statistics.median(on) * 1e3:.3f} ms (median), {statistics.fmean(on) * 1e3:.3f} ms (mean)")
    print(f"recorder_per_step: {per_step * 1e6:.1f} us mean, {statistics.median(own) * 1e6:.1f} us median "
          f"(timed directly, {recorded} recorded steps), plus on_add {adds * 1e6:.1f} us per step")
    print(f"recorder_share: {share:.2f} % (mean recorder time with on_add / mean off step; a loaded machine "
          f"stretches both alike)")
    print(f"ratio: {ratio:.3f} (paired median; 90% interval {lo:.3f}-{hi:.3f})")
    print(f"ratio_mean: {sum(on) / sum(off):.3f}")
    print(f"cpu_ratio: {cpu:.3f} (90% interval {cpu_lo:.3f}-{cpu_hi:.3f})")
    print(f"gc_per_step: {statistics.fmean(gc_time[True]) * 1e6:.1f} us on, {statistics.fmean(gc_time[False]) * 1e6:.1f} "
          f"us off (mean; Python's collector, not in recorder_per_step)")
    probes = timer.calls.get(PROBE) or [0.0]
    # Nested ones (flush, _write_step) cost inside on_update's time too; on_add is outside the steps.
    timed_calls = sum(len(c) for name, c in timer.calls.items() if name not in (PROBE, "on_add")) / max(recorded, 1)
    floor = statistics.median(probes)
    print(f"timing_floor: {floor * 1e6:.2f} us per timed call (median of a timed no-op, in place), "
          f"{timed_calls:.1f} timed calls per recorded step: ~{floor * timed_calls * 1e6:.1f} us of recorder_per_step "
          f"(and of the on steps) is the bench's own timing")
    half = 50 * (hi - lo)
    print(f"noise: the ratio's interval is +-{half:.2f} %, the recorder's timed share {share:.2f} %: "
          + ("the ratio cannot resolve the recorder here, recorder_share is the overhead figure" if half > share
             else "the ratio resolves the recorder"))
    if args.profile:
        for name, s in sorted(timer.spent.items(), key=lambda kv: -kv[1]):
            calls = timer.calls[name]
            print(f"  {name}: {s / max(recorded, 1) * 1e6:.1f} us/step, {len(calls)} calls, "
                  f"{statistics.median(calls) * 1e6:.1f} us median call")
    tmp.cleanup()


if __name__ == "__main__":
    main()
