"""Builders for scheduler tests: small configs, requests with known tokens, a fake model runner."""
from __future__ import annotations

from engine.core import (CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler,
                         SchedulerConfig, SchedulerOutput)

EOS = 2


def make_scheduler(num_blocks: int = 10_000, block_size: int = 16, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 8192, max_model_len: int = 8192,
                   enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                   long_prefill_token_threshold: int = 0, policy: str = "fcfs",
                   watermark: float = 0.0) -> Scheduler:
    sched = SchedulerConfig(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=max_num_batched_tokens,
                            enable_chunked_prefill=enable_chunked_prefill,
                            long_prefill_token_threshold=long_prefill_token_threshold, policy=policy)
    cache = CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks,
                        enable_prefix_caching=enable_prefix_caching, watermark=watermark)
    return Scheduler(sched, cache, clock=lambda: 0.0)


def make_requests(num: int, num_tokens: int = 10, max_tokens: int = 16, start: int = 0,
                  same_prompt: bool = False, prefix: list[int] | None = None, min_tokens: int = 0,
                  ignore_eos: bool = False, stop_token_ids: list[int] | None = None,
                  priorities: list[int] | None = None, arrival_times: list[float] | None = None,
                  cache_salt: str | None = None) -> list[Request]:
    reqs = []
    for i in range(start, start + num):
        base = 1000 if same_prompt else 1000 + i * num_tokens
        body = [base + k for k in range(num_tokens - len(prefix or []))]
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos,
                                stop_token_ids=stop_token_ids or [], temperature=0.0)
        j = i - start
        reqs.append(Request(f"r{i}", (prefix or []) + body, params, eos_token_id=EOS,
                            arrival_time=arrival_times[j] if arrival_times else float(i),
                            priority=priorities[j] if priorities else 0, cache_salt=cache_salt))
    return reqs


def fake_output(out: SchedulerOutput, sched: Scheduler, token: int = 7,
                tokens: dict[str, int] | None = None) -> ModelRunnerOutput:
    """What a model runner returns: one token for every request whose prompt is now fully computed."""
    req_ids, sampled = [], []
    for rid in out.num_scheduled_tokens:
        req = sched.requests.get(rid)
        req_ids.append(rid)
        done_prefill = req is not None and req.num_computed_tokens >= req.num_tokens
        sampled.append([(tokens or {}).get(rid, token)] if done_prefill else [])
    return ModelRunnerOutput(req_ids, sampled)


def step(sched: Scheduler, token: int = 7, tokens: dict[str, int] | None = None):
    out = sched.schedule()
    return out, sched.update_from_output(out, fake_output(out, sched, token, tokens))


def run_to_completion(sched: Scheduler, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_unfinished_requests():
        step(sched)
        steps += 1
        assert steps < max_steps, "scheduler did not converge"
    return steps
