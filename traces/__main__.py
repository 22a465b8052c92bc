"""`python -m traces export TRACE_DIR... -o OUT.json` (Perfetto / Chrome trace JSON) and
`python -m traces summary TRACE_DIR`; a bad trace or an unwritable output is one line and exit 2."""
from __future__ import annotations

import argparse
import sys

from traces.reader import TraceError, load


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m traces", description="Work with stepscope trace directories.")
    sub = p.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write Chrome/Perfetto trace JSON (open in ui.perfetto.dev)")
    ex.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR", help="one process per trace, side by side")
    ex.add_argument("-o", "--output", required=True, metavar="OUT.json")
    sm = sub.add_parser("summary", help="print a run's headline metrics")
    sm.add_argument("trace_dir", metavar="TRACE_DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "export":
            from traces.perfetto import export_perfetto

            doc = export_perfetto(args.trace_dirs, args.output)
            print(f"wrote {args.output}: {len(doc['traceEvents'])} events from {len(args.trace_dirs)} trace(s)")
        else:
            from traces.summary import format_summary, summarize

            t = load(args.trace_dir)
            print(format_summary(summarize(t.requests, t.steps)))
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        path = e.filename if e.filename is not None else getattr(args, "output", "?")
        print(f"error: {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
