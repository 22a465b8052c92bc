"""`traces.load(path)`: a trace directory (streamed or compacted) as pandas DataFrames."""
from __future__ import annotations

import json
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from traces.arrowstream import arrow_stream_file, read_arrow_stream
from traces.schema import FORMAT_VERSION, META_FILE, SPANS_FILE, TABLES, parquet_file, stream_file


class TraceError(ValueError):
    """A directory that is not a readable trace; the message is one line naming the path."""


class TruncatedTraceWarning(UserWarning):
    pass


def read_stream(path: Path, columns: tuple[str, ...]) -> tuple[pd.DataFrame, bool]:
    """Rows of a JSON-lines stream with the schema's columns first (plus any extra ones a writer added);
    a partial last line (a run killed mid-write) is dropped."""
    rows, truncated = [], False
    if path.exists():
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if i >= len(lines) - 2:
                    truncated = True
                    break
                raise TraceError(f"{path}: line {i + 1} is not JSON") from None
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in columns]  # e.g. a cluster's `replica`
    return df.reindex(columns=[*columns, *extra]), truncated


class Trace:
    """One run: `.meta` (dict) and `.steps`, `.requests`, `.decisions`, `.spans`, `.block_events`,
    `.block_snapshots` (DataFrames). A trace cut short is read up to its last completed step."""

    def __init__(self, path: Path, meta: dict[str, Any], tables: dict[str, pd.DataFrame]) -> None:
        self.path = path
        self.meta = meta
        self.steps = tables["steps"]
        self.requests = tables["requests"]
        self.decisions = tables["decisions"]
        self.block_events = tables["block_events"]
        self.block_snapshots = tables["block_snapshots"]

    @property
    def source(self) -> str:
        return self.meta.get("source", "?")

    @property
    def complete(self) -> bool:
        return bool(self.meta.get("complete"))

    @cached_property
    def spans(self) -> pd.DataFrame:
        """Spans flattened from the OTLP JSON lines: name, ids, parent, start/end (s since run start), attributes."""
        from traces.otlp import read_spans

        return read_spans(self.path / SPANS_FILE, self.meta.get("clock_origin_unix_ns"))

    def __repr__(self) -> str:
        return (f"Trace({str(self.path)!r}, source={self.source}, steps={len(self.steps)}, "
                f"requests={len(self.requests)}, complete={self.complete})")


def _arrow_lists(ty):
    import pyarrow as pa

    return pd.ArrowDtype(ty) if pa.types.is_list(ty) or pa.types.is_large_list(ty) else None


def load(path: str | Path, arrow_lists: bool = False) -> Trace:
    """Read a trace directory. `arrow_lists` keeps Parquet list columns (block ids, token ids) in Arrow
    instead of building a Python list per row: a 100k-step trace then opens in a fraction of the time
    (the TUI uses it)."""
    root = Path(path)
    meta_path = root / META_FILE
    if not root.is_dir():
        raise TraceError(f"{root}: not a directory")
    if not meta_path.is_file():
        raise TraceError(f"{root}: not a trace directory (no {META_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise TraceError(f"{meta_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceError(f"{meta_path}: format_version is {version!r}, this stepscope reads {FORMAT_VERSION}")
    tables: dict[str, pd.DataFrame] = {}
    truncated = []
    for table, columns in TABLES.items():
        pq = root / parquet_file(table)
        if pq.is_file():
            if arrow_lists:
                import pyarrow.parquet

                tables[table] = pyarrow.parquet.read_table(pq).to_pandas(types_mapper=_arrow_lists)
            else:
                tables[table] = pd.read_parquet(pq)
        else:
            arrows = root / arrow_stream_file(table)  # a batched writer's stream (traces/arrowstream.py)
            if arrows.is_file():
                tables[table], cut = read_arrow_stream(arrows, columns)
            else:
                tables[table], cut = read_stream(root / stream_file(table), columns)
            if cut:
                truncated.append(table)
    if not meta.get("complete"):
        _clip_to_last_step(tables)
    if truncated:
        warnings.warn(f"{root}: trace ends mid-write ({', '.join(truncated)}); read up to the last complete step",
                      TruncatedTraceWarning, stacklevel=2)
    return Trace(root, meta, tables)


def _clip_to_last_step(tables: dict[str, pd.DataFrame]) -> None:
    """A step's decisions and block events are written before its steps row: drop any beyond that row."""
    steps = tables["steps"]
    last = int(steps["step"].max()) if len(steps) else -1
    for name in ("decisions", "block_events", "block_snapshots"):
        df = tables[name]
        if len(df):
            tables[name] = df[df["step"] <= last].reset_index(drop=True)
