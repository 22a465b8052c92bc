"""Scheduler overhead per step: `schedule()` + `update_from_output()` with a fake one-token model.

Run from the repo root: `python bench/scheduler.py`. Prints one line per case, the median over repeats
of the mean microseconds per step, so it can be compared line by line with vLLM's own scheduler.
Times are this process's CPU time (the scheduler is single-threaded Python), which other processes on
a shared machine disturb far less than wall time.
"""
from __future__ import annotations

import itertools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core import (CacheConfig, ModelRunnerOutput, Request, SamplingParams,  # noqa: E402
                         Scheduler, SchedulerConfig, SchedulerOutput)

BLOCK_SIZE = 16
MAX_MODEL_LEN = 32_768
DECODE_PROMPT_LEN = 32
REPEATS = 5
_token_base = itertools.count(3, 100_000)


def make_scheduler(budget: int, num_blocks: int) -> Scheduler:
    sched = SchedulerConfig(max_model_len=MAX_MODEL_LEN, max_num_seqs=2048, max_num_batched_tokens=budget,
                            enable_chunked_prefill=True)
    cache = CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=num_blocks, enable_prefix_caching=True)
    return Scheduler(sched, cache)


def make_request(rid: str, prompt_len: int, max_tokens: int) -> Request:
    """Distinct token ids per request, so no prefix hits blur the per-step cost."""
    base = next(_token_base)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return Request(rid, [base + k for k in range(prompt_len)], params, eos_token_id=2,
                   block_size=BLOCK_SIZE)


def fake_output(out: SchedulerOutput, sched: Scheduler) -> ModelRunnerOutput:
    """One token for every scheduled request whose prompt is fully computed, nothing for a chunk."""
    reqs = sched.requests
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = reqs[rid]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(req_ids, sampled)


def one_step(sched: Scheduler) -> None:
    out = sched.schedule()
    sched.update_from_output(out, fake_output(out, sched))


def bench_decode(num_reqs: int, num_steps: int) -> float:
    blocks_per_req = -(-(DECODE_PROMPT_LEN + 50 + num_steps * (REPEATS + 1)) // BLOCK_SIZE) + 1
    sched = make_scheduler(8192, num_reqs * blocks_per_req + 16)
    for i in range(num_reqs):
        sched.add_request(make_request(f"d{i}", DECODE_PROMPT_LEN, MAX_MODEL_LEN - DECODE_PROMPT_LEN - 1))
    # Warm up until every request is decoding (one token scheduled each), plus a few steps more.
    while not (len(sched.running) == num_reqs
               and all(r.num_computed_tokens == r.num_tokens - 1 for r in sched.running)):
        one_step(sched)
    for _ in range(num_steps):
        one_step(sched)
    per_step = []
    for _ in range(REPEATS):
        t0 = time.process_time()
        for _ in range(num_steps):
            one_step(sched)
        per_step.append((time.process_time() - t0) / num_steps * 1e6)
    assert len(sched.running) == num_reqs and not sched.waiting, "a decode was preempted or stopped"
    return statistics.median(per_step)


def bench_mixed(num_decodes: int, prompt_len: int, num_steps: int) -> float:
    """`num_decodes` steady decodes plus one new prompt per step; each new prompt is prefilled in one
    step and stops after its first token (max_tokens=1), so the running set stays the same size."""
    blocks_per_req = -(-(DECODE_PROMPT_LEN + 50 + num_steps * (REPEATS + 1)) // BLOCK_SIZE) + 1
    sched = make_scheduler(2048, num_decodes * blocks_per_req + 8 * (prompt_len // BLOCK_SIZE + 1) + 16)
    for i in range(num_decodes):
        sched.add_request(make_request(f"d{i}", DECODE_PROMPT_LEN, MAX_MODEL_LEN - DECODE_PROMPT_LEN - 1))
    while not (len(sched.running) == num_decodes
               and all(r.num_computed_tokens == r.num_tokens - 1 for r in sched.running)):
        one_step(sched)
    prompts = [make_request(f"p{i}", prompt_len, 1) for i in range(num_steps * (REPEATS + 1))]
    it = iter(prompts)
    for _ in range(num_steps):
        sched.add_request(next(it))
        one_step(sched)
    per_step = []
    for _ in range(REPEATS):
        t0 = time.process_time()
        for _ in range(num_steps):
            sched.add_request(next(it))
            one_step(sched)
        per_step.append((time.process_time() - t0) / num_steps * 1e6)
    assert len(sched.running) == num_decodes and not sched.waiting, "the mixed case did not stay steady"
    return statistics.median(per_step)


def main() -> None:
    for n, steps in ((64, 400), (256, 200), (1024, 60)):
        print(f"decode {n}: {bench_decode(n, steps):.1f} us/step", flush=True)
    print(f"mixed 256+512: {bench_mixed(256, 512, 150):.1f} us/step", flush=True)


if __name__ == "__main__":
    main()
