"""`sim` command line. The simulator itself lands with its own issue; today this prints its usage."""
from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sim", description="Discrete-event simulator on the engine's own scheduler.")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("replay", help="replay a workload file or an engine trace (not built yet)")
    sub.add_parser("calibrate", help="fit a cost model from engine traces (not built yet)")
    sub.add_parser("compare", help="fidelity report between two traces (not built yet)")
    sub.add_parser("plan", help="capacity planning under SLOs (not built yet)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 0
    print(f"sim {args.command}: not available yet in this version of stepscope")
    return 2
