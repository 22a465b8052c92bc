"""`traces.load(path)`: a trace directory (streamed or compacted) as pandas DataFrames. A damaged trace is
a `TraceError` of one line naming the file and the problem; a Parquet file that cannot be read gives way
to the JSON lines it was made from when they are still there (a run killed mid-compaction)."""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from traces.arrowstream import arrow_stream_file, read_arrow_stream
from traces.errors import TraceError, TraceWarning
from traces.frames import STEP_ROW_TABLES, arrow_to_frame, clip_rows
from traces.meta import read_meta
from traces.schema import SPANS_FILE, TABLES, parquet_file, stream_file
from traces.streams import StreamError, first_row_keys, read_stream


class TruncatedTraceWarning(TraceWarning):
    pass


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

    @property
    def imported(self) -> bool:
        """A measured run brought in by `sim import-run`: its requests, and no steps to replay."""
        return "import" in self.meta and not len(self.steps)

    @cached_property
    def spans(self) -> pd.DataFrame:
        """Spans flattened from the OTLP JSON lines: name, ids, parent, start/end (s since run start), attributes."""
        from traces.otlp import read_spans

        path = self.path / SPANS_FILE
        if path.exists() and not path.is_file():
            raise TraceError(f"{path}: not a regular file; spans must be one")
        return read_spans(path, self.meta.get("clock_origin_unix_ns"))

    def __repr__(self) -> str:
        return (f"Trace({str(self.path)!r}, source={self.source}, steps={len(self.steps)}, "
                f"requests={len(self.requests)}, complete={self.complete})")


def check_columns(path: Path, names: Iterable[str], required: Sequence[str]) -> None:
    """A one-line TraceError naming the file and the required columns it lacks."""
    have = set(names)
    missing = [c for c in required if c not in have]
    if missing:
        raise TraceError(f"{path}: required column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} missing")


def _read_parquet(path: Path, table: str, columns: Sequence[str] | None, arrow_lists: bool,
                  categories: Sequence[str], last_step: int | None) -> pd.DataFrame:
    """One compacted table, only `columns` of it when given, rows of steps after `last_step` dropped;
    raises pyarrow/OS errors for a damaged file."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    check_columns(path, names, TABLES[table])
    pf = pq.ParquetFile(path, read_dictionary=[c for c in categories if c in names])
    wanted = None if columns is None else [c for c in names if c in set(columns)]
    return arrow_to_frame(clip_rows(pf.read(columns=wanted), last_step), arrow_lists)


def table_paths(root: Path, table: str) -> tuple[Path, Path, Path]:
    """The table's Parquet file and its stream (the `.arrows` one of a batched writer where no `.jsonl`
    is), and the `.arrows` path. A table file that is not a regular file (a FIFO, a link to /dev/zero)
    is refused: its size says nothing and reading it might never end."""
    pq_path, stream = root / parquet_file(table), root / stream_file(table)
    arrows = root / arrow_stream_file(table)
    for path in (pq_path, stream, arrows):
        if path.exists() and not path.is_file():
            raise TraceError(f"{path}: not a regular file; a trace table must be one")
    if arrows.is_file() and not stream.is_file():
        stream = arrows
    return pq_path, stream, arrows


def parquet_fallback(pq_path: Path, stream: Path, error: Exception) -> str:
    """A table's Parquet file could not be read: the note that its stream is read instead, or a
    TraceError where there is none to fall back on (a TraceError of the reader's own stands)."""
    if isinstance(error, TraceError):
        raise error
    reason = (str(error).splitlines() or [type(error).__name__])[0]
    if not stream.is_file():
        raise TraceError(f"{pq_path}: unreadable Parquet ({reason})") from None
    return f"{pq_path}: unreadable Parquet ({reason}); read {stream.name} instead"


def _read_table(root: Path, table: str, columns: Sequence[str] | None, arrow_lists: bool,
                notes: list[str], categories: Sequence[str] = (),
                last_step: int | None = None) -> tuple[pd.DataFrame, bool]:
    import pyarrow as pa

    pq_path, stream, arrows = table_paths(root, table)
    if pq_path.is_file():
        try:
            return _read_parquet(pq_path, table, columns, arrow_lists, categories, last_step), False
        except (pa.ArrowException, OSError, ValueError) as e:
            notes.append(parquet_fallback(pq_path, stream, e))
    if stream == arrows:
        return read_arrow_stream(arrows, TABLES[table], arrow_lists=arrow_lists, only=columns,
                                 categories=categories, last_step=last_step)
    keys = first_row_keys(stream)
    if keys is not None:
        check_columns(stream, keys, TABLES[table])
    try:
        df, cut = read_stream(stream, table, TABLES[table], arrow_lists=arrow_lists, only=columns,
                              categories=categories, last_step=last_step)
    except StreamError as e:
        raise TraceError(str(e)) from None
    except OSError as e:
        raise TraceError(f"{stream}: {e.strerror or e}") from None
    return df, cut


def load(path: str | Path, arrow_lists: bool = False, columns: Mapping[str, Sequence[str]] | None = None,
         tables: Iterable[str] | None = None, categories: Sequence[str] = ()) -> Trace:
    """Read a trace directory. List columns (block ids, token ids) hold a read-only numpy array per row
    (None for a null row; the empty rows all one shared array; lists from JSON lines the schema cannot
    type); `arrow_lists` keeps them in Arrow instead:
    a 100k-step trace then opens in a fraction of the time (the TUI uses it).
    `columns` reads only those columns of the tables it names and `tables` only those tables (the others
    are empty), and `categories` names string columns to read as pandas Categoricals (request ids, events):
    summaries of a long run then hold a fraction of it in memory."""
    root = Path(path)
    meta = read_meta(root)
    wanted = set(TABLES if tables is None else tables)
    out: dict[str, pd.DataFrame] = {}
    truncated: list[str] = []
    notes: list[str] = []
    last_step = None
    for table, cols in TABLES.items():  # steps first: a trace cut short is clipped to its last steps row
        if table not in wanted:
            out[table] = pd.DataFrame(columns=list(cols))
        else:
            clip: int | None = last_step if table in STEP_ROW_TABLES else None
            out[table], cut = _read_table(root, table, (columns or {}).get(table), arrow_lists, notes, categories,
                                          clip)
            if cut:
                truncated.append(table)
            _release_arrow_memory()
        if table == "steps" and not meta.get("complete") and wanted.intersection(STEP_ROW_TABLES):
            last_step = _last_step(root, out["steps"] if table in wanted else None)
    _drop_bad_rows(root, out, notes)
    for note in notes:
        warnings.warn(note, TraceWarning, stacklevel=2)
    if truncated:
        warnings.warn(f"{root}: trace ends mid-write ({', '.join(truncated)}); read up to the last complete step",
                      TruncatedTraceWarning, stacklevel=2)
    return Trace(root, meta, out)


# What readers rely on: one row per key, and finite times where a row says something happened.
_KEYS = {"steps": "step", "requests": "request_id"}
_FINITE = {"steps": ("start", "end"), "requests": ("arrival",)}


def _drop_bad_rows(root: Path, out: dict[str, pd.DataFrame], notes: list[str]) -> None:
    """Drop rows that repeat a step or request id (keeping the first) and rows whose times are not finite,
    saying how many: a table with every row twice read as twice the steps and halved the TPOT, and NaN
    times flowed into percentiles and fits. Steps come back in step order."""
    import numpy as np

    for table, key in _KEYS.items():
        df = out[table]
        if not len(df) or key not in df.columns:
            continue
        bad = df[key].duplicated().to_numpy(copy=True)
        if bad.any():
            notes.append(f"{root}: {table}: dropped {int(bad.sum())} row(s) repeating a {key}")
        for col in _FINITE[table]:
            if col in df.columns:
                values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
                nonfinite = ~np.isfinite(values) & ~bad
                if nonfinite.any():
                    notes.append(f"{root}: {table}: dropped {int(nonfinite.sum())} row(s) whose {col} is not finite")
                    bad |= nonfinite
        if bad.any():
            df = df[~bad]
        if table == "steps" and not df[key].is_monotonic_increasing:
            df = df.sort_values(key, kind="stable")
        if df is not out[table]:
            out[table] = df.reset_index(drop=True)


def _last_step(root: Path, steps: pd.DataFrame | None) -> int:
    """The last step a trace cut short completed (-1 for none): a step's decisions and block events are
    written before its steps row, so readers drop any beyond it. Steps not read (None), or read without
    their step column, are read for it alone."""
    if steps is None or "step" not in steps.columns:
        steps, _ = _read_table(root, "steps", ("step",), False, [])
    return int(steps["step"].max()) if len(steps) else -1


def _release_arrow_memory() -> None:
    """Hand back the pages Arrow's allocator (mimalloc) keeps after a table is converted: the next table's
    reading then starts from what the frames hold, not from that plus every buffer freed so far."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
