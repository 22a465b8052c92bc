"""`tui TRACE_DIR [TRACE_DIR_B]`: step through a trace's scheduler decisions, or compare two runs.
A directory that is not a trace is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from engine.core.flags import OneLineParser
from traces.console import command, run_command

if TYPE_CHECKING:
    from tui.model import RunIndex


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tui", description="Step through scheduler decisions in a trace directory; "
                      "with two, compare them step by step (e.g. an engine run and its sim replay).")
    p.add_argument("trace_dir", nargs="?", help="trace directory (engine or sim)")
    p.add_argument("trace_dir_b", nargs="?", help="second trace directory to compare with the first")
    return p


def main(argv: list[str] | None = None) -> int:
    """The traces are opened at the command's edge (a bad one is its one line); the app runs after it,
    since Textual takes Ctrl-C as a key and prints a crash's traceback itself."""
    from traces import TraceError

    parser = _parser()
    runs: list[RunIndex] = []

    def load(args: argparse.Namespace) -> int:
        if args.trace_dir is None:
            parser.print_help()
            return 0
        from tui.loader import open_trace
        from tui.model import RunIndex

        runs.extend(RunIndex(open_trace(path), label) for path, label in ((args.trace_dir, "A"),
                                                                          (args.trace_dir_b, "B")) if path is not None)
        return 0

    rc = run_command(command(parser, load), argv, (TraceError,))
    if rc or not runs:
        return rc
    from tui.app import StepscopeApp

    app = StepscopeApp(*runs)
    app.run()
    return app.return_code or 0  # the exit status says a crash too
