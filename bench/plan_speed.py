"""Capacity-planning speed: a 48-configuration `sim plan` over the Azure 2023 conversation trace —
replicas 1..4 x max_num_seqs 64,128,256 x hardware h100,h200 x block size 16,32 — with the roofline
model of llama-3.1-8b, SLOs ttft_p99=2s,tpot_p99=80ms, rate tolerance 5%.

Run from the repo root: `python bench/plan_speed.py [--max-requests N] [--jobs N] [--ray ADDRESS] [--baseline]`.
Prints the ranked table, then `plan 48 configs: <seconds> s` (wall time, workload loading included) and
`plan cpu time: <seconds> s` (this process and its worker processes, steadier than the wall time).
`--baseline` runs the plan again with `--no-reuse` (every configuration simulated), checks that it prints
the same table, and prints `ratio:` (baseline time / time).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim.cli import main as sim_main  # noqa: E402

AZURE_CONV = "workloads/azure_conv.yaml"
SWEEP = "replicas=1..4,max_num_seqs=64,128,256,hardware=h100,h200,block_size=16,32"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-requests", type=int, default=500, help="the trace's first N requests (default 500)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--ray", default=None, help="run on Ray instead ('auto': a local instance)")
    p.add_argument("--baseline", action="store_true", help="also run with --no-reuse and compare")
    args = p.parse_args()
    argv = [AZURE_CONV, "--slo", "ttft_p99=2s,tpot_p99=80ms", "--sweep", SWEEP, "--max-requests",
            str(args.max_requests), "--price", "h100=2.5/h,h200=3.5/h", "--rate-tol", "0.05", "--no-progress"]
    if args.jobs:
        argv += ["--jobs", str(args.jobs)]
    if args.ray:
        argv += ["--ray", args.ray]
    rc, wall, table, cpu = _timed(argv)
    print(table, end="")
    print(f"plan 48 configs: {wall:.1f} s ({args.max_requests} requests of {AZURE_CONV}, "
          f"{args.jobs or os.cpu_count()} {'Ray workers' if args.ray else 'processes'})")
    if not args.ray:  # Ray's workers are not this process's children
        print(f"plan cpu time: {cpu:.1f} s (this process and its worker processes)")
    if args.baseline:
        rc_base, base, base_table, _ = _timed([*argv, "--no-reuse"])
        same = _ranked(table) == _ranked(base_table)
        print(f"plan 48 configs, every configuration simulated: {base:.1f} s")
        print(f"tables identical: {'yes' if same else 'NO'}")
        print(f"ratio: {base / wall:.2f}")
        rc = rc or rc_base or (0 if same else 1)
    return rc


def _timed(argv: list[str]) -> tuple[int, float, str, float]:
    """(exit status, wall seconds, printed table, CPU seconds of this process and its finished children:
    steadier than the wall time on a shared machine)."""
    out = io.StringIO()
    start, cpu0 = time.perf_counter(), _cpu()
    with contextlib.redirect_stdout(out):
        rc = sim_main(["plan", *argv])
    return rc, time.perf_counter() - start, out.getvalue(), _cpu() - cpu0


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _ranked(table: str) -> list[str]:
    """The table without its closing count line (which says how many configurations were simulated)."""
    return [line for line in table.splitlines() if " configurations" not in line]


if __name__ == "__main__":
    sys.exit(main())
