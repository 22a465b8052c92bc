"""Cost of tracing in the engine's hot loop: the same requests with tracing off and on, alternating,
median over repeats. Prints mean step time for each and `ratio: on / off` (aim: <= 1.03).

    python bench/tracing_overhead.py [--repeats 5] [--num-seqs 32] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_run(traced: bool, args, prompts) -> float:
    from engine import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(device="cpu", max_model_len=1024, kv_cache_memory=64 << 20, num_threads=args.threads,
                  trace=tmp if traced else None)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        core = llm.llm_engine.engine_core.engine_core
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)
        steps0, t = core.num_steps, time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        per_step = (time.perf_counter() - t) / (core.num_steps - steps0)
        llm.shutdown()
    return per_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 4000 for j in range(32 + (i * 37) % 160)]}
               for i in range(args.num_seqs)]
    off, on = [], []
    for _ in range(args.repeats):
        off.append(one_run(False, args, prompts))
        on.append(one_run(True, args, prompts))
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"tracing off: {off_ms:.3f} ms/step")
    print(f"tracing on: {on_ms:.3f} ms/step")
    print(f"ratio: {on_ms / off_ms:.3f}")


if __name__ == "__main__":
    main()
