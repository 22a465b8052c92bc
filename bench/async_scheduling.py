"""Does async scheduling overlap anything in the live engine? Wall time of the same greedy batch,
synchronous vs async scheduling (vLLM 0.32's batch queue of two), on this machine's device.

Every configuration is built once and warmed up, then the runs interleave (A B C A B C ...) so that a
change in the machine's load hits them alike. Async runs once per step-overlap mode: the engine's
default for the device, and the others the runner offers ("none": the same async decisions with no
overlap, "thread": the CPU worker thread, "launch": queued on the device, which overlaps only on CUDA).

Prints each configuration's median seconds and `ratio: X` = default async / sync; below 1 means the
next step's host work really overlapped the device.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def _engine(async_scheduling: bool, mode: str | None, a: argparse.Namespace):
    from engine import LLM, SamplingParams

    # On CUDA each engine would take most of the device's memory for its KV cache; 256 MiB each is plenty.
    kv = {"kv_cache_memory": 256 << 20} if a.device.startswith("cuda") else {}
    llm = LLM(model=None, device=a.device, max_num_seqs=a.prompts, async_scheduling=async_scheduling,
              num_threads=a.num_threads, **kv)
    core = llm.llm_engine.engine_core.engine_core
    if mode is not None:
        core.set_step_overlap(mode)
    llm.generate(_prompts(2), SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)  # warm-up
    return llm, core.executor.collective_rpc("get_step_overlap")[0]


def _prompts(n: int) -> list[dict]:
    return [{"prompt_token_ids": [5 + i, 17, 42, 8] * 8} for i in range(n)]


def _time(llm, a: argparse.Namespace) -> tuple[float, list]:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(_prompts(a.prompts), params, use_tqdm=False)
    return time.perf_counter() - t0, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (engine default if unset)")
    a = p.parse_args()
    modes = ("none", "launch") if a.device.startswith("cuda") else ("none", "thread", "launch")
    engines = {"sync": _engine(False, None, a)}
    default = _engine(True, None, a)
    engines[f"async:{default[1]} (default)"] = default
    for mode in modes:
        if mode != default[1]:
            engines[f"async:{mode}"] = _engine(True, mode, a)
    times: dict[str, list[float]] = {name: [] for name in engines}
    runs: list[list] = []
    for _ in range(a.repeats):
        for name, (llm, _) in engines.items():
            t, toks = _time(llm, a)
            times[name].append(t)
            runs.append(toks)
    same = all(toks == runs[0] for toks in runs)
    import torch

    print(f"device {a.device}, torch threads {torch.get_num_threads()}, {a.prompts} prompts x {a.max_tokens} "
          f"tokens, {a.repeats} interleaved repeats, load {os.getloadavg()[0]:.2f}, same tokens: {same}")
    sync = statistics.median(times["sync"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} median {med:.3f} s  (min {min(ts):.3f})  vs sync {med / sync:.3f}")
    default_name = next(n for n in times if n.endswith("(default)"))
    print(f"ratio: {statistics.median(times[default_name]) / sync:.3f}")


if __name__ == "__main__":
    main()
