"""Open a trace for the TUI: `traces.load` with list columns kept in Arrow (a 100k-step trace opens
in a fraction of the time), and every failure to read it turned into one `TraceError` line."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traces import Trace, TraceError, load
from traces.schema import STEP_COLUMNS, TABLES

REQUIRED_STEP_COLUMNS = STEP_COLUMNS[:12]
# Per-token lists no view shows: on a long run they are most of the requests table's bytes.
UNSHOWN = {"requests": ("prompt_token_ids", "output_token_ids")}
# Strings repeated on every row (10M decision rows name 78k requests and two events): read as
# dictionary codes, they are decoded once per distinct value instead of once per row.
REPEATED_STRINGS = ("request_id", "event", "phase", "finish_reason", "kind", "preempted_for")
# What the TUI shows as counts, ids and block lists: a null in one of these has nothing it could mean.
NOT_NULL = {
    "steps": REQUIRED_STEP_COLUMNS,
    "requests": ("request_id", "arrival", "num_prompt_tokens"),
    "decisions": ("step", "request_id", "event", "num_tokens", "prefix_hit_tokens"),
    "block_events": ("step", "seq", "kind", "request_id", "block_ids"),
    "block_snapshots": ("step", "block_id", "holders", "cached"),
}


def open_trace(path: str | Path) -> Trace:
    """A `traces.Trace`; every failure to read it is a one-line `TraceError` naming the path."""
    root = Path(path)
    try:
        columns = {t: [c for c in TABLES[t] if c not in skip] for t, skip in UNSHOWN.items()}
        trace = load(root, arrow_lists=True, columns=columns, categories=REPEATED_STRINGS)
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{root}: unreadable trace ({first})") from None
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in trace.steps.columns]
    if missing:
        raise TraceError(f"{root}: steps table lacks {', '.join(missing)}")
    _check_cells(root, trace)
    return trace


def _check_cells(root: Path, trace: Trace) -> None:
    """Refuse, in one line naming the table and column, a trace the TUI would misdraw or fail on midway:
    nulls where it needs a value, requests missing for the decisions, block ids outside the pool."""
    for table, columns in NOT_NULL.items():
        df = getattr(trace, table)
        for c in columns:
            if c in df.columns and (n := int(df[c].isna().sum())):
                raise TraceError(f"{root}: {table}.{c}: {n} of {len(df)} rows are null")
    if len(trace.decisions) and not len(trace.requests):
        raise TraceError(f"{root}: requests: no readable rows, while decisions name {trace.decisions.request_id.nunique()}")
    if len(trace.steps):
        pool = int(trace.steps["kv_blocks_total"].max()) + 1
        for table, column in (("block_events", "block_ids"), ("block_snapshots", "block_id")):
            ids = pa.table({column: getattr(trace, table)[column]})[column]
            if pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type):
                ids = pc.list_flatten(ids)
            lo, hi = pc.min_max(ids).values()
            if lo.as_py() is not None and (lo.as_py() < 0 or hi.as_py() >= pool):
                raise TraceError(f"{root}: {table}.{column}: block ids {lo.as_py()}..{hi.as_py()} outside the pool "
                                 f"of {pool} blocks (steps.kv_blocks_total)")
