"""Does async scheduling overlap anything in the live engine? Wall time of the same greedy batch,
synchronous vs async scheduling (vLLM 0.32's batch queue of two), on this machine's device.

Prints `sync_s`, `async_s` (medians over repeats) and `ratio: async/sync`; below 1 means the next step's
host work really overlapped the device.
"""
from __future__ import annotations

import argparse
import statistics
import time


def _run(async_scheduling: bool, device: str, num_prompts: int, max_tokens: int) -> float:
    from engine import LLM, SamplingParams

    llm = LLM(model=None, device=device, max_num_seqs=num_prompts, async_scheduling=async_scheduling)
    prompts = [{"prompt_token_ids": [5 + i, 17, 42, 8] * 8} for i in range(num_prompts)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    sync = [_run(False, a.device, a.prompts, a.max_tokens) for _ in range(a.repeats)]
    asyn = [_run(True, a.device, a.prompts, a.max_tokens) for _ in range(a.repeats)]
    s, t = statistics.median(sync), statistics.median(asyn)
    print(f"sync_s: {s:.3f} s")
    print(f"async_s: {t:.3f} s")
    print(f"ratio: {t / s:.3f}")


if __name__ == "__main__":
    main()
