"""`tui TRACE_DIR [TRACE_DIR_B]`: step through a trace's scheduler decisions, or compare two runs.
A directory that is not a trace is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse

from engine.core.flags import OneLineParser


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tui", description="Step through scheduler decisions in a trace directory; "
                      "with two, compare them step by step (e.g. an engine run and its sim replay).")
    p.add_argument("trace_dir", nargs="?", help="trace directory (engine or sim)")
    p.add_argument("trace_dir_b", nargs="?", help="second trace directory to compare with the first")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # a bad flag: one line already on stderr
        return int(e.code or 0)
    if args.trace_dir is None:
        p.print_help()
        return 0
    from traces import TraceError
    from traces.console import run_cli
    from tui.loader import open_trace
    from tui.model import RunIndex

    runs = []

    def load_all() -> int:
        runs.extend(RunIndex(open_trace(path), label) for path, label in ((args.trace_dir, "A"),
                                                                          (args.trace_dir_b, "B")) if path is not None)
        return 0

    if run_cli("tui", load_all, (TraceError,)) != 0:
        return 2
    from tui.app import StepscopeApp

    app = StepscopeApp(*runs)
    app.run()
    return app.return_code or 0  # Textual prints a crash's traceback itself; the exit status says it too
