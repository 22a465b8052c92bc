"""`tui TRACE_DIR [TRACE_DIR_B]`: step through a trace's scheduler decisions, or compare two runs.
A directory that is not a trace is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tui", description="Step through scheduler decisions in a trace directory; "
                                "with two, compare them step by step (e.g. an engine run and its sim replay).")
    p.add_argument("trace_dir", nargs="?", help="trace directory (engine or sim)")
    p.add_argument("trace_dir_b", nargs="?", help="second trace directory to compare with the first")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.trace_dir is None:
        p.print_help()
        return 0
    from traces import TraceError
    from tui.loader import open_trace
    from tui.model import RunIndex

    try:
        runs = [RunIndex(open_trace(path), label) for path, label in ((args.trace_dir, "A"), (args.trace_dir_b, "B"))
                if path is not None]
    except TraceError as e:
        print(f"tui: error: {e}", file=sys.stderr)
        return 2
    from tui.app import StepscopeApp

    StepscopeApp(*runs).run()
    return 0
