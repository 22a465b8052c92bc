"""`python -m traces export TRACE_DIR... -o OUT.json` (Perfetto / Chrome trace JSON) and
`python -m traces summary TRACE_DIR`; a bad trace or an unwritable output is one line and exit 2."""
from __future__ import annotations

import argparse
import sys

from engine.core.flags import OneLineParser
from traces.console import command, run_command
from traces.errors import TraceError


def _export(args: argparse.Namespace) -> int:
    from traces.outputs import Output, check_outputs
    from traces.perfetto import export_perfetto

    check_outputs([Output("-o", args.output)], args.trace_dirs)
    n = export_perfetto(args.trace_dirs, args.output)
    print(f"wrote {args.output}: {n} events from {len(args.trace_dirs)} trace(s)")
    return 0


def _summary(args: argparse.Namespace) -> int:
    from traces.summary import trace_summary

    print(trace_summary(args.trace_dir))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m traces", description="Work with stepscope trace directories.")
    sub = p.add_subparsers(dest="command", required=True)
    ex = command(sub.add_parser("export", help="write Chrome/Perfetto trace JSON (open in ui.perfetto.dev)"), _export)
    ex.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR", help="one process per trace, side by side")
    ex.add_argument("-o", "--output", required=True, metavar="OUT.json")
    sm = command(sub.add_parser("summary", help="print a run's headline metrics"), _summary)
    sm.add_argument("trace_dir", metavar="TRACE_DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(_parser(), argv, (TraceError,))


if __name__ == "__main__":
    sys.exit(main())
