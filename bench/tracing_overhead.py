"""Cost of tracing in the engine's hot loop: the same requests with tracing off and on, alternating,
median over repeats. Prints mean step time for each, `ratio: on / off`, the recorder's own time per
step (its on_add, on_step and on_abort calls, timed around them in the traced runs), that time as a share
of an untraced step, and the median of each repeat's own on / off ratio (the pair's order alternating).

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


class TimedRecorder:
    """Stands in for the step cycle's recorder and adds up the time spent in it."""

    def __init__(self, recorder) -> None:
        self.recorder = recorder
        self.seconds = 0.0

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t

    def on_add(self, request):
        return self._timed(self.recorder.on_add, request)

    def on_step(self, so, outputs, times):
        return self._timed(self.recorder.on_step, so, outputs, times)

    def on_abort(self, freed):
        return self._timed(self.recorder.on_abort, freed)


def one_run(traced: bool, args, prompts) -> tuple[float, float]:
    """(seconds per step, seconds per step inside the recorder)."""
    from engine import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(device="cpu", max_model_len=1024, kv_cache_memory=64 << 20, num_threads=args.threads,
                  trace=tmp if traced else None)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        core = llm.llm_engine.engine_core.engine_core
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)
        timed = None
        if traced:
            core.cycle.recorder = timed = TimedRecorder(core.cycle.recorder)
        steps0, t = core.num_steps, time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        steps = core.num_steps - steps0
        per_step = (time.perf_counter() - t) / steps
        if timed is not None:
            core.cycle.recorder = timed.recorder
        llm.shutdown()
    return per_step, (timed.seconds / steps if timed is not None else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-seqs", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 4000 for j in range(32 + (i * 37) % 160)]}
               for i in range(args.num_seqs)]
    off, on, recorder = [], [], []
    for i in range(args.repeats):
        # Which run of a pair goes first alternates, so that whatever the second run of a pair pays
        # (a warmer or a fuller machine) falls on each side equally often.
        for traced in ((False, True) if i % 2 == 0 else (True, False)):
            step, inside = one_run(traced, args, prompts)
            (on if traced else off).append(step)
            if traced:
                recorder.append(inside)
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    recorder_s = statistics.median(recorder)
    print(f"tracing off: {off_ms:.3f} ms/step")
    print(f"tracing on: {on_ms:.3f} ms/step")
    print(f"recorder: {recorder_s * 1e6:.1f} us/step")
    # The recorder's own time is measured around its calls, so its share resolves what the ratio of two
    # noisy step times cannot on a shared machine; the paired ratio compares each traced run with the
    # untraced run beside it, so drift between repeats cancels.
    print(f"recorder share: {recorder_s * 1e3 / off_ms * 100:.2f} % of an untraced step")
    print(f"paired ratio: {statistics.median(b / a for a, b in zip(off, on)):.3f} (median of each repeat's on / off,"
          " the traced run first in every other pair)")
    print(f"ratio: {on_ms / off_ms:.3f}")


if __name__ == "__main__":
    main()
