"""Peak memory and time of `python -m traces export` against a trace's size: the export streams its
events, so peak memory should grow with the trace's tables (without token ids), well below the events.

Builds synthetic traces (one request, two decisions and one step per request id; 100 prompt and 20
output token ids per request) of each size, exports each `--repeat` times in a fresh process, and
prints medians: `export_peak_rss_<n>: MB`, `export_time_<n>: s`, and `ratio:` of the largest size's
peak over the smallest's.

    python bench/export_memory.py [--sizes 50000,200000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEASURE = """
import resource, sys, time
from traces.perfetto import export_perfetto
t = time.perf_counter()
n = export_perfetto([sys.argv[1]], sys.argv[2])
print(n, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def make_trace(path: Path, n: int) -> None:
    from traces.writer import TraceWriter

    w = TraceWriter(path, {"source": "sim", "config": {}}, flush_every=4096, stream_format="arrow")
    prompt, output = list(range(100)), list(range(20))
    for i in range(n):
        rid, t = f"w{i}", i * 0.01
        w.write_rows("requests", [{"request_id": rid, "arrival": t, "queued": t, "first_scheduled": t + .01,
                                   "first_token": t + .02, "finish": t + .5, "num_prompt_tokens": 100,
                                   "num_output_tokens": 20, "num_cached_tokens": 0, "num_preemptions": 0,
                                   "finish_reason": "length", "priority": 0, "max_tokens": 20,
                                   "prompt_token_ids": prompt, "output_token_ids": output}])
        w.write_rows("decisions", [
            {"step": i, "request_id": rid, "event": "schedule", "num_tokens": 100, "phase": "prefill",
             "num_computed_tokens": 0, "prefix_hit_tokens": 0, "blocks_gained": [1, 2], "blocks_freed": []},
            {"step": i, "request_id": rid, "event": "finish", "num_tokens": 0, "finish_reason": "length",
             "blocks_gained": [], "blocks_freed": [1, 2]}])
        w.write_rows("steps", [{"step": i, "start": t, "end": t + 0.01, "num_prefill_tokens": 100,
                                "num_decode_tokens": 20, "num_scheduled_tokens": 120, "num_running": 5,
                                "num_waiting": 1, "num_preempted": 0, "kv_blocks_used": 10, "kv_blocks_total": 1000,
                                "prefix_hit_tokens": 0, "num_new_reqs": 1, "num_finished": 1,
                                "schedule_time": .001, "execute_time": .008, "sample_time": .001}])
        w.flush()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="50000,200000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load: {os.getloadavg()[0]:.2f} (1-min load average, {os.cpu_count()} CPUs)")
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            trace = Path(tmp) / f"t{n}"
            make_trace(trace, n)
            rss, secs = [], []
            for _ in range(args.repeat):
                out = subprocess.run([sys.executable, "-c", MEASURE, str(trace), str(Path(tmp) / "out.json")],
                                     cwd=ROOT, capture_output=True, text=True, check=True)
                events, seconds, maxrss_kb = out.stdout.split()
                rss.append(int(maxrss_kb) / 1024)
                secs.append(float(seconds))
            peaks[n] = statistics.median(rss)
            print(f"export_events_{n}: {events} events")
            print(f"export_peak_rss_{n}: {peaks[n]:.0f} MB")
            print(f"export_time_{n}: {statistics.median(secs):.2f} s")
    print(f"ratio: {peaks[sizes[-1]] / peaks[sizes[0]]:.2f}  (peak memory, {sizes[-1]} over {sizes[0]} requests)")


if __name__ == "__main__":
    main()
