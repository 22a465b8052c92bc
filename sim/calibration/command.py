"""`sim calibrate TRACE_DIR... -o PROFILE.json`: the command around sim.calibration.calibrate, whose
numpy and pandas load only when it runs, not when `sim` builds its parser."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traces import Trace


def calibrate_arguments(p: argparse.ArgumentParser) -> None:
    """`sim calibrate`'s flags, on its subparser of `sim`."""
    p.add_argument("traces", nargs="+", metavar="TRACE_DIR", help="engine trace directories")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")


def _load(path: str, warns: list[str]) -> Trace:
    """The trace, its warnings kept for the end of the report rather than shown as they come."""
    from traces import load

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load(path)
    warns.extend(str(w.message) for w in caught)
    return trace


def run_calibrate(args: argparse.Namespace) -> int:
    """`sim calibrate ...`; bad input raises, for `sim`'s one error path (one line, exit status 2)."""
    from sim.calibration.calibrate import calibrate, report_lines
    from traces.outputs import Output, check_outputs, replaced_when_done

    warns: list[str] = []
    out = Path(args.output)
    if not out.parent.is_dir():
        raise ValueError(f"{out}: directory {out.parent} does not exist")
    check_outputs([Output("-o", out)], args.traces)
    profile, fit_warns = calibrate([_load(p, warns) for p in args.traces])
    with replaced_when_done(out, "-o") as tmp:  # a full disk never leaves half of it over the old one
        tmp.write_text(profile.to_json())
    for w in warns + fit_warns:
        print(f"sim calibrate: warning: {w}", file=sys.stderr)
    for line in report_lines(profile, str(out)):
        print(line)
    return 0
