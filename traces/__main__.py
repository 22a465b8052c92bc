"""`python -m traces export TRACE_DIR... -o OUT.json` (Perfetto / Chrome trace JSON) and
`python -m traces summary TRACE_DIR`; a bad trace or an unwritable output is one line and exit 2."""
from __future__ import annotations

import argparse
import sys

from engine.core.flags import OneLineParser
from traces.console import run_cli
from traces.reader import TraceError


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m traces", description="Work with stepscope trace directories.")
    sub = p.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    ex.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR", help="one process per trace, side by side")
    ex.add_argument("-o", "--output", required=True, metavar="OUT.json")
    sm = sub.add_parser("summary", help="print a run's headline metrics")
    sm.add_argument("trace_dir", metavar="TRACE_DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # a bad flag: one line already on stderr
        return int(e.code or 0)

    def body() -> int:
        if args.command == "export":
            from traces.outputs import Output, check_outputs
            from traces.perfetto import export_perfetto

            check_outputs([Output("-o", args.output)], args.trace_dirs)

            n = export_perfetto(args.trace_dirs, args.output)
            print(f"wrote {args.output}: {n} events from {len(args.trace_dirs)} trace(s)")
        else:
            from traces.summary import trace_summary

            print(trace_summary(args.trace_dir))
        return 0

    return run_cli(f"python -m traces {args.command}", body, (TraceError,))


if __name__ == "__main__":
    sys.exit(main())
