"""Open a trace for the TUI quickly: a compacted trace's list columns (block ids, token ids) stay in Arrow
until a row is looked at, which makes a 100k-step trace open in a fraction of `traces.load`'s time.
Streamed (still running or killed) traces go through `traces.load`, which knows how to cut them."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces import FORMAT_VERSION, Trace, TraceError, load
from traces.schema import META_FILE, STEP_COLUMNS, TABLES, parquet_file

REQUIRED_STEP_COLUMNS = STEP_COLUMNS[:12]


def _arrow_lists(ty: pa.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(ty) if pa.types.is_list(ty) or pa.types.is_large_list(ty) else None


def _compacted(root: Path) -> dict | None:
    """meta.json of a complete, compacted trace of this format version; None when `load` must decide."""
    if not all((root / parquet_file(t)).is_file() for t in TABLES):
        return None
    try:
        meta = json.loads((root / META_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    ok = isinstance(meta, dict) and meta.get("complete") and meta.get("format_version") == FORMAT_VERSION
    return meta if ok else None


def open_trace(path: str | Path) -> Trace:
    """A `traces.Trace`; every failure to read it is a one-line `TraceError` naming the path."""
    root = Path(path)
    try:
        meta = _compacted(root)
        if meta is None:
            trace = load(root)
        else:
            tables = {t: pq.read_table(root / parquet_file(t)).to_pandas(types_mapper=_arrow_lists)
                      for t in TABLES}
            trace = Trace(root, meta, tables)
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"{root}: unreadable trace ({first})") from None
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in trace.steps.columns]
    if missing:
        raise TraceError(f"{root}: steps table lacks {', '.join(missing)}")
    return trace
