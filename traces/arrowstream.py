"""Arrow IPC streams, the batched writers' form of a table while the run goes on (`<table>.arrows`).

A batched writer (the simulator) hands the OS one record batch per table every `flush_every` steps:
no JSON to print per row, none to parse at compaction. The IPC stream format writes the schema first
and then whole, length-prefixed batches, so a run killed mid-write leaves every earlier batch readable.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from traces.outputs import replaced_when_done

# Row groups of at most this many rows: a compacted table is read column by column, and a few large
# groups compress better than one per flush. And of at most this many bytes: a group is held whole while
# it is written, and the requests table's token ids make its rows large.
ROW_GROUP_ROWS = 1 << 19
ROW_GROUP_BYTES = 64 << 20
# The keys a reader selects rows by. No reader here uses statistics; min/max of every column would
# slow compaction for nothing.
STATISTICS_COLUMNS = ("step", "request_id")


def arrow_stream_file(table: str) -> str:
    return f"{table}.arrows"


def to_batch(columns: dict[str, list[Any]], schema: Any) -> Any:
    """The buffered columns (one Python list each, in the schema's order) as one Arrow record batch.
    `pa.array` with the column's type converts list columns (null rows, tuples) itself: on pyarrow 26
    it is as fast as building offsets and values by hand for long lists (token ids) and two to three
    times faster for the short ones most rows carry (block ids, mostly none)."""
    import pyarrow as pa

    return pa.record_batch([_token_lists(columns[f.name], f.type) if f.name in TOKEN_COLUMNS
                            else pa.array(columns[f.name], f.type) for f in schema], schema=schema)


# Columns of long int lists (a request's token ids): converted through numpy rather than pa.array's
# per-element conversion, the larger part of the requests table's write cost.
TOKEN_COLUMNS = frozenset({"prompt_token_ids", "output_token_ids"})


def _token_lists(values: list[Any], typ: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    if any(v is None for v in values):
        return pa.array(values, typ)
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    # array.fromlist copies a list of ints in C, twice as fast as np.fromiter over a chain of them.
    flat = array("q")
    for v in values:
        if type(v) is list:
            flat.fromlist(v)
        else:
            flat.extend(v)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.frombuffer(flat, np.int64)), type=typ)


def iter_batches(path: Path, memory_map: bool = True) -> tuple[Any, Iterator[Any], list[bool]]:
    """(schema, batches, truncated flag): batches up to the last complete one; `truncated[0]` turns True
    when the stream ends mid-batch (a run killed while writing). Without `memory_map` each batch is read
    into memory of its own, freed with it: walking a long stream then keeps one batch resident, not
    every page of the file touched so far."""
    import pyarrow as pa

    truncated = [False]
    reader = pa.ipc.open_stream(pa.memory_map(str(path)) if memory_map else pa.OSFile(str(path)))

    def batches() -> Iterator[Any]:
        while True:
            try:
                yield reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowInvalid, OSError):
                truncated[0] = True
                return

    return reader.schema, batches(), truncated


def read_arrow_stream(path: Path, columns: tuple[str, ...], arrow_lists: bool = False,
                      only: Sequence[str] | None = None, categories: Sequence[str] = (),
                      last_step: int | None = None) -> tuple[Any, bool]:
    """A stream as a pandas DataFrame with the schema's columns first, and whether its end was cut;
    an empty file (the schema goes out with the first batch) is an empty table, one cut inside its
    schema an empty table cut short. `arrow_lists`, `only`, `categories` and `last_step` as in
    `traces.frames.table_to_frame`.

    With `arrow_lists` the frame's strings and lists stay in Arrow, zero-copy over a memory map of the
    file: pages are read as they are looked at (the TUI opening a running trace). Otherwise every value
    is converted, which would leave each page of a map resident as long as the frame's strings point into
    it; each batch is then read into memory and its wanted columns copied out of it at once, as a batch's
    columns are slices of one buffer that any of them left in the frame would keep whole."""
    import pandas as pd
    import pyarrow as pa

    if path.stat().st_size == 0:
        return pd.DataFrame(columns=list(columns)), False
    try:
        schema, batches, truncated = iter_batches(path, memory_map=arrow_lists)
    except (pa.ArrowInvalid, OSError):
        return pd.DataFrame(columns=list(columns)), True
    from traces.frames import table_to_frame

    if arrow_lists:
        tbl = pa.Table.from_batches(list(batches), schema=schema)
    else:
        kept = pa.schema([f for f in schema if only is None or f.name in set(only)])
        owned = [pa.record_batch([pa.concat_arrays([b.column(c)]) for c in kept.names], schema=kept) for b in batches]
        tbl = pa.Table.from_batches(owned, schema=kept)
        del owned
    return table_to_frame(tbl, columns, only, categories, arrow_lists, last_step), truncated[0]


def dictionary_columns(schema: Any) -> list[str]:
    """The Parquet columns worth dictionary-encoding: strings (request ids, events, phases) and list
    values (token and block ids repeat). Times and counts are nearly all distinct, so a dictionary only
    costs time there before Parquet falls back to plain, for files of the same size."""
    import pyarrow as pa

    out = []
    for f in schema:
        if pa.types.is_list(f.type):
            out.append(f"{f.name}.list.element")
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            out.append(f.name)
    return out


def arrow_stream_to_parquet(src: Path, dst: Path) -> None:
    """Copy a stream's batches into a Parquet file, a few large row groups at a time (memory stays
    flat: the stream is read, not mapped, so only the group at hand is resident), written under a
    temporary name and renamed, so a kill leaves either no Parquet or a whole one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema, batches, _ = iter_batches(src, memory_map=False)
    # Column statistics (min/max per row group) only where a reader would select row groups by them.
    stats = [c for c in STATISTICS_COLUMNS if c in schema.names]
    with (replaced_when_done(dst) as tmp,
          pq.ParquetWriter(tmp, schema, use_dictionary=dictionary_columns(schema), write_statistics=stats) as out):
        group: list[Any] = []
        rows = size = 0
        for batch in batches:
            group.append(batch)
            rows += batch.num_rows
            size += batch.nbytes
            if rows >= ROW_GROUP_ROWS or size >= ROW_GROUP_BYTES:
                out.write_table(pa.Table.from_batches(group, schema=schema))
                group, rows, size = [], 0, 0
        if group:
            out.write_table(pa.Table.from_batches(group, schema=schema))
