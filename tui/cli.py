"""`tui` command line. The Textual app lands with its own issue; today this prints its usage."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tui", description="Step through scheduler decisions in a trace directory.")
    p.add_argument("trace_dir", nargs="?", help="trace directory (engine or sim)")
    p.add_argument("trace_dir_b", nargs="?", help="second trace directory to compare")
    args = p.parse_args(argv)
    if args.trace_dir is None:
        p.print_help()
        return 0
    print("tui: not available yet in this version of stepscope")
    return 2
