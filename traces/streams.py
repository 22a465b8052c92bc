"""Reading a table's JSON-lines stream (a trace still running, or killed): through Arrow with the schema's
column types, so a crash-recovered trace costs about what its Parquet would, not a Python dict per row."""
from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from traces.frames import clip_frame, table_to_frame
from traces.schema import arrow_schema


class StreamError(ValueError):
    """A stream that is not JSON lines beyond its last line; the message names the file and line."""


MAX_ROW_BYTES = 64 << 20  # no row of a trace table comes near it: a longer last line is not a row


def _complete_bytes(path: Path, size: int) -> tuple[int, bool]:
    """How many leading bytes are whole lines, and whether a partial last line (a run killed mid-write)
    was cut off. Reads only the tail."""
    with open(path, "rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size, False
        pos = size
        chunks: list[bytes] = []
        while pos > 0 and not (chunks and b"\n" in chunks[-1]):
            if size - pos >= MAX_ROW_BYTES:
                raise StreamError(f"{path}: its last line runs past {MAX_ROW_BYTES >> 20} MiB; not JSON lines")
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            chunks.append(f.read(step))
    tail = b"".join(reversed(chunks))
    cut = pos + tail.rfind(b"\n") + 1
    try:
        orjson.loads(tail[cut - pos:])
        return size, False  # a whole last row whose newline was never written
    except orjson.JSONDecodeError:
        return cut, True


def read_stream(path: Path, table: str, columns: tuple[str, ...], extra_int_columns: tuple[str, ...] = (),
                arrow_lists: bool = False, only: Sequence[str] | None = None,
                categories: Sequence[str] = (), last_step: int | None = None) -> tuple[pd.DataFrame, bool]:
    """Rows of `<table>.jsonl` with the schema's columns first (plus any a writer added, such as a cluster's
    `replica`) and whether a partial last line was dropped. Rows Arrow cannot type fall back to pandas.
    `only` keeps just those columns and `categories` makes those string columns pandas Categoricals, both
    done in Arrow before any Python object is built: columns not in `only` are not even parsed. Rows of
    steps after `last_step` are dropped (traces.frames.clip_rows)."""
    import pyarrow as pa
    import pyarrow.json as pj

    size = path.stat().st_size if path.exists() else 0
    end, truncated = _complete_bytes(path, size) if size else (0, False)
    if end == 0:
        return pd.DataFrame(columns=list(columns)), truncated
    try:
        with _prefix_file(path, end) as source:
            tbl = pj.read_json(source, read_options=pj.ReadOptions(block_size=BLOCK_BYTES),
                               parse_options=_parse_options(table, extra_int_columns, only))
    except pa.ArrowInvalid:
        with open(path, "rb") as f:
            df = clip_frame(_read_rows(path, f.read(end), columns), last_step)
        return (df if only is None else df[[c for c in df.columns if c in set(only)]]), truncated
    return table_to_frame(tbl, columns, only, categories, arrow_lists, last_step), truncated


# JSON is parsed this many bytes at a time: a block's rows are typed and the text let go before the next.
BLOCK_BYTES = 16 << 20
# Arrow's streaming JSON reader keeps dozens of blocks in flight: smaller ones bound its memory.
STREAM_BLOCK_BYTES = 2 << 20


def _parse_options(table: str, extra_int_columns: tuple[str, ...], only: Sequence[str] | None) -> Any:
    """The schema's types; with `only`, just those columns, every other key skipped unparsed."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = arrow_schema(table, extra_int_columns)
    if only is None:
        return pj.ParseOptions(explicit_schema=schema)
    keep = set(only)
    return pj.ParseOptions(explicit_schema=pa.schema([f for f in schema if f.name in keep]),
                           unexpected_field_behavior="ignore")


class _Prefix(io.RawIOBase):
    """The first `end` bytes of a file, read through an ordinary buffer: a memory map would count the
    whole stream as resident while Arrow parses it."""

    def __init__(self, f: io.BufferedIOBase, end: int) -> None:
        self.f, self.left = f, end

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.f.readinto(memoryview(b)[:min(len(b), self.left)])
        self.left -= n
        return n


@contextmanager
def _prefix_file(path: Path, end: int) -> Iterator[Any]:
    import pyarrow as pa

    with open(path, "rb") as f:
        yield pa.PythonFile(io.BufferedReader(_Prefix(f, end), BLOCK_BYTES), mode="r")


def stream_batches(path: Path, table: str, only: Sequence[str],
                   extra_int_columns: tuple[str, ...] = ()) -> tuple[Iterator[Any], bool]:
    """`<table>.jsonl` as Arrow record batches of just the `only` columns, one parsed block at a time
    (memory stays flat however long the stream), and whether a partial last line was dropped. Raises
    pyarrow.ArrowInvalid, possibly midway, for rows the schema cannot type."""
    import pyarrow.json as pj

    size = path.stat().st_size if path.exists() else 0
    end, truncated = _complete_bytes(path, size) if size else (0, False)

    def batches() -> Iterator[Any]:
        if end == 0:
            return
        with _prefix_file(path, end) as source:
            yield from pj.open_json(source, read_options=pj.ReadOptions(block_size=STREAM_BLOCK_BYTES),
                                    parse_options=_parse_options(table, extra_int_columns, only))

    return batches(), truncated


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


# The first row is read this far at most: a stream without a newline in it is not read whole to find one.
FIRST_ROW_BYTES = 1 << 20


def first_row_keys(path: Path) -> set[str] | None:
    """Column names of a stream's first row (None for an empty stream, or a first row too long to check
    here): enough to see a missing column."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        line = f.readline(FIRST_ROW_BYTES)
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return set(row) if isinstance(row, dict) else None
