"""Reading a table's JSON-lines stream (a trace still running, or killed): through Arrow with the schema's
column types, so a crash-recovered trace costs about what its Parquet would, not a Python dict per row."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import orjson
import pandas as pd

from traces.schema import arrow_schema


class StreamError(ValueError):
    """A stream that is not JSON lines beyond its last line; the message names the file and line."""


def _complete_bytes(path: Path, size: int) -> tuple[int, bool]:
    """How many leading bytes are whole lines, and whether a partial last line (a run killed mid-write)
    was cut off. Reads only the tail."""
    with open(path, "rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size, False
        pos, tail = size, b""
        while pos > 0 and b"\n" not in tail:
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
    cut = pos + tail.rfind(b"\n") + 1
    try:
        orjson.loads(tail[cut - pos:])
        return size, False  # a whole last row whose newline was never written
    except orjson.JSONDecodeError:
        return cut, True


def read_stream(path: Path, table: str, columns: tuple[str, ...], extra_int_columns: tuple[str, ...] = (),
                arrow_lists: bool = False, only: Sequence[str] | None = None,
                categories: Sequence[str] = ()) -> tuple[pd.DataFrame, bool]:
    """Rows of `<table>.jsonl` with the schema's columns first (plus any a writer added, such as a cluster's
    `replica`) and whether a partial last line was dropped. Rows Arrow cannot type fall back to pandas.
    `only` keeps just those columns and `categories` makes those string columns pandas Categoricals, both
    done in Arrow before any Python object is built."""
    import pyarrow as pa
    import pyarrow.json as pj

    size = path.stat().st_size if path.exists() else 0
    if size == 0:
        return pd.DataFrame(columns=list(columns)), False
    end, truncated = _complete_bytes(path, size)
    with pa.memory_map(str(path)) as source:
        buf = source.read_buffer()
        if end == 0:
            return pd.DataFrame(columns=list(columns)), truncated
        try:
            schema = arrow_schema(table, extra_int_columns)
            tbl = pj.read_json(pa.BufferReader(buf.slice(0, end)),
                               read_options=pj.ReadOptions(block_size=16 << 20),
                               parse_options=pj.ParseOptions(explicit_schema=schema))
        except pa.ArrowInvalid:
            df = _read_rows(path, bytes(buf.slice(0, end)), columns)
            return (df if only is None else df[[c for c in df.columns if c in set(only)]]), truncated
    return table_to_frame(tbl, columns, only, categories, arrow_lists), truncated


def table_to_frame(tbl, columns: Sequence[str], only: Sequence[str] | None, categories: Sequence[str],
                   arrow_lists: bool) -> pd.DataFrame:
    """An Arrow table of one trace table as the reader hands it out: schema columns first, then extra ones,
    only `only` when given, `categories` dictionary-encoded, list columns as Arrow lists on request."""
    names = [*columns, *(c for c in tbl.column_names if c not in columns)]
    if only is not None:
        names = [c for c in names if c in set(only)]
    tbl = tbl.select(names)
    for c in categories:
        if c in names:
            tbl = tbl.set_column(names.index(c), c, tbl[c].dictionary_encode())
    return tbl.to_pandas(types_mapper=_arrow_list_dtype if arrow_lists else None)


def _arrow_list_dtype(ty):
    import pyarrow as pa

    return pd.ArrowDtype(ty) if pa.types.is_list(ty) or pa.types.is_large_list(ty) else None


def _read_rows(path: Path, data: bytes, columns: tuple[str, ...]) -> pd.DataFrame:
    """Row by row, for a stream whose values do not fit the schema's types; names the first bad line."""
    rows = []
    for i, line in enumerate(data.split(b"\n")):
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise StreamError(f"{path}: line {i + 1} is not JSON") from None
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in columns]
    return df.reindex(columns=[*columns, *extra])


def first_row_keys(path: Path) -> set[str] | None:
    """Column names of a stream's first row (None for an empty stream): enough to see a missing column."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        line = f.readline()
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return set(row) if isinstance(row, dict) else None
