"""One table of a trace as Arrow record batches of a few columns, read a batch at a time: what a summary
of a long run walks through (its tens of millions of decision rows) instead of holding the table.

The file is chosen as `traces.load` chooses it (Parquet, else the `.arrows` or `.jsonl` stream, and a
Parquet file that cannot be opened gives way to the stream with a `TraceWarning`). Iterating raises
`TraceError` for a damaged file; `pyarrow.ArrowInvalid` (only from JSON lines, possibly midway) means
rows the schema cannot type, which `traces.load` reads row by row instead.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.arrowstream import iter_batches
from traces.errors import TraceError, TraceWarning
from traces.reader import check_columns, parquet_fallback, table_paths
from traces.schema import TABLES
from traces.streams import first_row_keys, stream_batches

# Rows per batch from Parquet: a few MB per column, so a step's worth of columns never adds up to much.
BATCH_ROWS = 1 << 17


@dataclass(slots=True)
class TableBatches:
    """Iterate for the batches; `truncated[0]` is True, at the latest once they are all read, when the
    stream was cut short (a killed run): the caller warns, as `traces.load` does. `num_rows`: known up
    front for Parquet, else None."""

    path: Path
    batches: Iterator[Any]
    truncated: list[bool] = field(default_factory=lambda: [False])
    num_rows: int | None = None

    def __iter__(self) -> Iterator[Any]:
        return self.batches


def table_batches(root: str | Path, table: str, columns: Sequence[str],
                  dictionary: Sequence[str] = ()) -> TableBatches:
    """`columns` of `table` batch by batch, in file order; `dictionary` names string columns to hand out
    dictionary-encoded when the file stores them so (Parquet), sparing a string per row."""
    import pyarrow as pa

    root = Path(root)
    pq_path, stream, arrows = table_paths(root, table)
    if pq_path.is_file():
        try:
            return _parquet(pq_path, table, columns, dictionary)
        except (pa.ArrowException, OSError, ValueError) as e:
            warnings.warn(parquet_fallback(pq_path, stream, e), TraceWarning, stacklevel=2)
    if stream == arrows:
        return _arrow_stream(arrows, columns)
    keys = first_row_keys(stream)
    if keys is not None:
        check_columns(stream, keys, TABLES[table])
    try:
        batches, cut = stream_batches(stream, table, columns)
    except OSError as e:
        raise TraceError(f"{stream}: {e.strerror or e}") from None
    return TableBatches(stream, batches, [cut])


def _parquet(path: Path, table: str, columns: Sequence[str], dictionary: Sequence[str]) -> TableBatches:
    """Opens the file now (so a damaged footer falls back to the stream) and reads it lazily, on this
    thread: Arrow's decoding threads would each keep an allocator heap resident."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, read_dictionary=[c for c in dictionary if c in columns])
    names = pf.schema_arrow.names
    check_columns(path, names, TABLES[table])

    def batches() -> Iterator[Any]:
        try:
            yield from pf.iter_batches(batch_size=BATCH_ROWS, columns=[c for c in columns if c in names],
                                       use_threads=False)
        except (pa.ArrowException, OSError) as e:
            raise TraceError(f"{path}: unreadable Parquet ({(str(e).splitlines() or [type(e).__name__])[0]})") from None

    return TableBatches(path, batches(), num_rows=pf.metadata.num_rows)


def _arrow_stream(path: Path, columns: Sequence[str]) -> TableBatches:
    """Read through a file, not a memory map: only the batch at hand is resident."""
    import pyarrow as pa

    if path.stat().st_size == 0:
        return TableBatches(path, iter(()))
    try:
        schema, batches, truncated = iter_batches(path, memory_map=False)
    except (pa.ArrowInvalid, OSError):
        return TableBatches(path, iter(()), [True])
    keep = [c for c in columns if c in schema.names]
    return TableBatches(path, (b.select(keep) for b in batches), truncated)
