"""Scheduler overhead per step: `schedule()` + `update_from_output()`, engine.core's and vLLM 0.32's.

Run from the repo root: `python bench/scheduler.py` (`--ours-only` skips vLLM). Both schedulers get the
same requests and the same fake model (one token per request whose prompt is fully computed, none for a
chunk); only their two calls are timed, not the fake model that builds the runner output in between.
Each case prints the median over repeats of the mean microseconds per step, for ours and, when vLLM is
installed, for vLLM's own Scheduler, and `ratio:` ours / vLLM's (0.1 is a tenth of vLLM's cost).
Times are this process's CPU time (the scheduler is single-threaded Python), which other processes on
a shared machine disturb far less than wall time.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BLOCK_SIZE = 16
MAX_MODEL_LEN = 32_768
DECODE_PROMPT_LEN = 32
REPEATS = 5
_token_base = itertools.count(3, 100_000)


def distinct_prompt(prompt_len: int) -> list[int]:
    """Distinct token ids per request, so no prefix hits blur the per-step cost."""
    base = next(_token_base)
    return [base + k for k in range(prompt_len)]


def one_token_each(ids: list[str], requests: dict[str, Any]) -> list[list[int]]:
    """The fake model both sides share: one token per scheduled request, none for a prefill chunk."""
    return [[] if requests[rid].is_prefill_chunk else [7] for rid in ids]


class Ours:
    name = "engine.core"

    def __init__(self) -> None:
        from engine.core import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
        self.CacheConfig, self.SchedulerConfig, self.Scheduler = CacheConfig, SchedulerConfig, Scheduler
        self.Request, self.SamplingParams, self.ModelRunnerOutput = Request, SamplingParams, ModelRunnerOutput

    def scheduler(self, budget: int, num_blocks: int) -> Any:
        sched = self.SchedulerConfig(max_model_len=MAX_MODEL_LEN, max_num_seqs=2048, max_num_batched_tokens=budget,
                                     enable_chunked_prefill=True)
        cache = self.CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=num_blocks, enable_prefix_caching=True)
        return self.Scheduler(sched, cache)

    def request(self, rid: str, prompt_len: int, max_tokens: int) -> Any:
        params = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        return self.Request(rid, distinct_prompt(prompt_len), params, eos_token_id=2, block_size=BLOCK_SIZE)

    def output(self, so: Any, sched: Any) -> Any:
        ids = list(so.num_scheduled_tokens)
        return self.ModelRunnerOutput(ids, one_token_each(ids, sched.requests))


class Vllm:
    """vLLM's own Scheduler, built as the conformance tests build it (tests/vllm_harness.py)."""

    name = "vllm"

    def __init__(self) -> None:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from vllm_harness import Setup, vllm_module
        self.m, self.Setup = vllm_module(), Setup
        self.hasher = self.m.get_request_block_hasher(BLOCK_SIZE, self.m.hash_fn)

    def scheduler(self, budget: int, num_blocks: int) -> Any:
        return self.m.scheduler(self.Setup(block_size=BLOCK_SIZE, num_blocks=num_blocks, max_num_seqs=2048,
                                           max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN))

    def request(self, rid: str, prompt_len: int, max_tokens: int) -> Any:
        params = self.m.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        params.update_from_generation_config({}, eos_token_id=2)
        return self.m.Request(rid, distinct_prompt(prompt_len), params, None, arrival_time=0.0,
                              block_hasher=self.hasher)

    def output(self, so: Any, sched: Any) -> Any:
        ids = list(so.num_scheduled_tokens)
        return self.m.ModelRunnerOutput(ids, {rid: i for i, rid in enumerate(ids)}, one_token_each(ids, sched.requests))


def timed_step(side: Any, sched: Any) -> float:
    """One step; returns the CPU seconds of the scheduler's two calls alone."""
    t0 = time.process_time()
    so = sched.schedule()
    t1 = time.process_time()
    out = side.output(so, sched)
    t2 = time.process_time()
    sched.update_from_output(so, out)
    return time.process_time() - t2 + t1 - t0


def measure(side: Any, sched: Any, num_steps: int, before_step: Any = None) -> float:
    """Median over REPEATS of the mean µs per step, after num_steps of warm-up."""
    per_step = []
    for rep in range(REPEATS + 1):
        total = 0.0
        for _ in range(num_steps):
            if before_step is not None:
                before_step()
            total += timed_step(side, sched)
        if rep:
            per_step.append(total / num_steps * 1e6)
    return statistics.median(per_step)


def warm_up_decodes(side: Any, sched: Any, num_reqs: int) -> None:
    for i in range(num_reqs):
        sched.add_request(side.request(f"d{i}", DECODE_PROMPT_LEN, MAX_MODEL_LEN - DECODE_PROMPT_LEN - 1))
    while not (len(sched.running) == num_reqs
               and all(r.num_computed_tokens == r.num_tokens - 1 for r in sched.running)):
        timed_step(side, sched)


def bench_decode(side: Any, num_reqs: int, num_steps: int) -> float:
    blocks_per_req = -(-(DECODE_PROMPT_LEN + 50 + num_steps * (REPEATS + 1)) // BLOCK_SIZE) + 1
    sched = side.scheduler(8192, num_reqs * blocks_per_req + 16)
    warm_up_decodes(side, sched, num_reqs)
    us = measure(side, sched, num_steps)
    assert len(sched.running) == num_reqs and not sched.waiting, "a decode was preempted or stopped"
    return us


def bench_mixed(side: Any, num_decodes: int, prompt_len: int, num_steps: int) -> float:
    """`num_decodes` steady decodes plus one new prompt per step; each new prompt is prefilled in one
    step and stops after its first token (max_tokens=1), so the running set stays the same size."""
    blocks_per_req = -(-(DECODE_PROMPT_LEN + 50 + num_steps * (REPEATS + 1)) // BLOCK_SIZE) + 1
    sched = side.scheduler(2048, num_decodes * blocks_per_req + 8 * (prompt_len // BLOCK_SIZE + 1) + 16)
    warm_up_decodes(side, sched, num_decodes)
    it = iter([side.request(f"p{i}", prompt_len, 1) for i in range(num_steps * (REPEATS + 1))])
    us = measure(side, sched, num_steps, lambda: sched.add_request(next(it)))
    assert len(sched.running) == num_decodes and not sched.waiting, "the mixed case did not stay steady"
    return us


CASES = (("decode 64", lambda s: bench_decode(s, 64, 400)),
         ("decode 256", lambda s: bench_decode(s, 256, 200)),
         ("decode 1024", lambda s: bench_decode(s, 1024, 60)),
         ("mixed 256+512", lambda s: bench_mixed(s, 256, 512, 150)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours-only", action="store_true", help="skip vLLM's scheduler")
    args = parser.parse_args()
    vllm = None
    if not args.ours_only:
        try:
            vllm = Vllm()
        except ImportError as e:
            print(f"vllm: not measured ({e})", flush=True)
    ours = Ours()
    for label, case in CASES:
        us = case(ours)
        print(f"{label}: {us:.1f} us/step", flush=True)
        if vllm is not None:
            theirs = case(vllm)
            print(f"{label} vllm: {theirs:.1f} us/step", flush=True)
            print(f"{label} ratio: {us / theirs:.3f}", flush=True)


if __name__ == "__main__":
    main()
