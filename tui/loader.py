"""Open a trace for the TUI: `traces.load` with list columns kept in Arrow (a 100k-step trace opens
in a fraction of the time), and every failure to read it turned into one `TraceError` line."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from traces import Trace, TraceError, load
from traces.schema import STEP_COLUMNS

REQUIRED_STEP_COLUMNS = STEP_COLUMNS[:12]


def open_trace(path: str | Path) -> Trace:
    """A `traces.Trace`; every failure to read it is a one-line `TraceError` naming the path."""
    root = Path(path)
    try:
        trace = load(root, arrow_lists=True)
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{root}: unreadable trace ({first})") from None
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in trace.steps.columns]
    if missing:
        raise TraceError(f"{root}: steps table lacks {', '.join(missing)}")
    return trace
