"""`engine` command line: `engine run` and `engine generate`."""
from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine", description="stepscope's live engine (vLLM v1 style).")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("run", help="run a workload and write a trace (not built yet)")
    sub.add_parser("generate", help="generate text for prompts (not built yet)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 0
    print(f"engine {args.command}: not available yet in this version of stepscope")
    return 2
