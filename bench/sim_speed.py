"""Simulator speed: replay the whole Azure 2023 conversation trace (19,366 requests, one hour) with the
roofline model of llama-3.1-8b on an H200, trace written and summarised, as `sim replay` does.

Run from the repo root: `python bench/sim_speed.py [--max-requests N] [--trace-level full|steps|none]
[--workload FILE.yaml] [--other-levels] [--profile] [--repeats N]`. Prints `steps/s: <n> steps/s` (simulated
steps per second of the event loop, recording included), `azure conv replay: <seconds> s` (end to end: request
stream, loop, trace compaction, summary), `cpu time: <seconds> s` (this process, all threads: steadier than
wall time on a shared machine), `peak rss: <n> MB` (the process's peak resident memory, summary included) and
`peak rss by phase: simulation <n> MB, summary <n> MB` (the peak of each: the simulation's includes the trace
compaction). `--workload` replays another workload file instead; the replay line then names it. The memory
check of a long run, 200k Poisson requests (14.6M decision rows, a few minutes), is `python bench/sim_speed.py
--workload bench/workloads/poisson_200k.yaml`: its `peak rss` is the figure to keep under 1 GB. `--profile`
prints the loop's top functions by own time for the first 1,000 requests. `--other-levels` then replays again
at each other trace level and prints one `trace level <level>: ...` line each (replay, loop, steps/s, cpu
time), so the cost of recording shows beside the full trace's. `--repeats N` replays N times: the time lines
are then medians, and `replay each:` lists every replay.
If the roofline model is not importable, a fixed-cost stand-in is used and the output says so.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core import CacheConfig, SchedulerConfig  # noqa: E402
from sim.cost_models.batch import StepBatch  # noqa: E402
from sim.core.simulator import Simulator  # noqa: E402
from sim.report.summary import format_sim_summary, load_for_summary, sim_summary  # noqa: E402
from sim.core.sources import open_source  # noqa: E402
from sim.cost_models.base import CostModelInfo, CostModelDefaults, StepTiming  # noqa: E402

AZURE_CONV = "workloads/azure_conv.yaml"
# llama-3.1-8b serves 128k tokens; the engine's 4,096 default would reject the trace's longest prompts.
MAX_MODEL_LEN = 32_768


class FixedCost(CostModelDefaults):
    """Stand-in when the roofline model is missing: 5 ms per step plus per-token costs."""

    name = "fixed-stand-in"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.005 + 4e-5 * batch.num_prefill_tokens + 2e-5 * batch.num_decode_tokens)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, meta={"note": "bench stand-in, not a model of any hardware"})


def cost_model():
    try:
        from sim.cost_models.roofline import RooflineCostModel
    except ImportError:
        return FixedCost(), "fixed-cost stand-in (roofline model not importable)"
    return RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h200"), "roofline llama-3.1-8b on h200"


def _hwm_mb(reset: bool = False) -> float | None:
    """Peak RSS so far (VmHWM), in MB; `reset` starts a new peak from the current RSS. None off Linux."""
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
    except (OSError, StopIteration):
        return None
    return hwm / 1024


def replay(limit: int | None, trace_dir: str, profile: bool = False, trace_level: str = "full",
           workload: str = AZURE_CONV) -> tuple[object, float, str, list[float | None]]:
    start = time.perf_counter()
    cm, label = cost_model()
    blocks = cm.num_gpu_blocks(16, 0.9) or 8192  # the stand-in knows no memory
    src = open_source(workload, limit=limit)
    sim = Simulator(SchedulerConfig(max_model_len=MAX_MODEL_LEN), CacheConfig(block_size=16, num_gpu_blocks=blocks),
                    cm, trace_dir, {"workload": src.meta}, trace_level=trace_level)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    result = sim.run(src.requests)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    del sim, src  # as in `sim replay`, the simulator is gone before the summary
    peaks = [_hwm_mb(reset=True)]
    summary = sim_summary(load_for_summary(trace_dir))
    peaks.append(_hwm_mb())
    return (result, summary), time.perf_counter() - start, label, peaks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-requests", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--trace-level", choices=("full", "steps", "none"), default="full",
                   help="what the trace keeps (sim replay --trace-level)")
    p.add_argument("--workload", default=AZURE_CONV, help="workload file to replay (default: the Azure conversation trace)")
    p.add_argument("--other-levels", action="store_true",
                   help="then replay at the other trace levels too, one timing line each")
    p.add_argument("--profile", action="store_true", help="profile the loop on the first 1,000 requests first")
    p.add_argument("--repeats", type=int, default=1,
                   help="replay this many times; the time lines are medians (a shared machine drifts by a third)")
    args = p.parse_args()
    if args.profile:
        with tempfile.TemporaryDirectory() as d:
            replay(1000, d, profile=True, trace_level=args.trace_level, workload=args.workload)
    totals, cpus, loops = [], [], []
    for _ in range(max(1, args.repeats)):
        cpu0 = time.process_time()
        with tempfile.TemporaryDirectory() as d:
            (result, summary), total, label, peaks = replay(args.max_requests, d, trace_level=args.trace_level,
                                                            workload=args.workload)
        totals.append(total)
        cpus.append(time.process_time() - cpu0)
        loops.append(result.wall_time)
    total, cpu = statistics.median(totals), statistics.median(cpus)
    print(f"cost model: {label}; trace level {args.trace_level}; {result.num_requests} requests, {result.num_steps} steps, "
          f"{result.sim_time:.0f} s simulated, loop {result.wall_time:.1f} s")
    print(format_sim_summary(summary))
    print(f"steps/s: {result.num_steps / statistics.median(loops):.0f} steps/s")
    name = "azure conv" if args.workload == AZURE_CONV else os.path.basename(args.workload)
    print(f"{name} replay: {total:.1f} s")
    if len(totals) > 1:
        print(f"replay each: {', '.join(f'{t:.1f}' for t in totals)} s (median above)")
    print(f"cpu time: {cpu:.1f} s")
    # ru_maxrss is in KiB on Linux: the whole run's peak, the summary included. Resetting VmHWM between
    # the phases does not lower it where the kernel keeps the maximum itself; the larger figure is the peak.
    whole = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, *(p for p in peaks if p is not None)]
    print(f"peak rss: {max(whole):.0f} MB")
    if None not in peaks:
        print(f"peak rss by phase: simulation {peaks[0]:.0f} MB, summary {peaks[1]:.0f} MB")
    if args.other_levels:
        for level in (lv for lv in ("full", "steps", "none") if lv != args.trace_level):
            cpu0 = time.process_time()
            with tempfile.TemporaryDirectory() as d:
                (result, _), total, _, _ = replay(args.max_requests, d, trace_level=level, workload=args.workload)
            print(f"trace level {level}: replay {total:.1f} s, loop {result.wall_time:.1f} s, "
                  f"{result.num_steps / result.wall_time:.0f} steps/s, cpu time {time.process_time() - cpu0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
