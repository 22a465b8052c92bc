"""Streaming trace writer: rows are buffered as columns and handed to the OS every `flush_every` steps
(every step for the engine), steps table last, so a run killed at any moment leaves every flushed step
readable; `close()` compacts the streams to Parquet. With `write_behind` (the engine's), a step only hands
its rows over, with those of the steps since the last hand-off at most HANDOFF_S before: a writer thread
encodes and writes them while the next steps run.

Two stream forms: JSON lines (`<table>.jsonl`, the engine's: one step at a time, readable with `tail`)
and Arrow IPC (`<table>.arrows`, batched writers such as the simulator: a record batch per table per
flush, no JSON printed per row nor parsed at compaction)."""
from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from traces.arrowstream import arrow_stream_file, arrow_stream_to_parquet, to_batch
from traces.runs import GridSpec, RunEntry, RunSpec, merge_runs
from traces.schema import FORMAT_VERSION, META_FILE, OPTIONAL_COLUMNS, TABLES, arrow_schema, parquet_file, stream_file
from traces.outputs import open_new_nofollow, replaced_when_done
from traces.trace_dir import TraceDirLock, TraceWriteError

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # numpy scalars from cost models and tables are plain numbers here
STREAM_FORMATS = ("jsonl", "arrow")


# One table's rows to write: (table, its columns, its run spec, its runs).
_Pending = tuple[str, dict[str, list[Any]], RunSpec | GridSpec | None, list[RunEntry] | None]


def _dumps(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=_OPTIONS)


def package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("stepscope", "torch", "transformers", "triton", "pandas", "pyarrow", "opentelemetry-sdk"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


class TraceWriter:
    """Owns a trace directory; rows go to the table streams until `close()` turns them into Parquet.

    The simulator passes a larger `flush_every`: a system call per table per simulated step would
    dominate the step itself. `stream_format` defaults to Arrow for such batched writers and to JSON
    lines for one that flushes every step (a record batch per step would be mostly framing)."""

    columnar = True  # lends its column buffers to a recorder (traces.recorder.TraceSink)
    MAX_HANDED = 64  # write-behind flushes that may wait for the writer thread
    HANDOFF_S = 0.02  # write-behind: the least time between two hand-offs to the writer thread

    def __init__(self, path: str | Path, meta: dict[str, Any], flush_every: int = 1,
                 extra_int_columns: tuple[str, ...] = (), stream_format: str | None = None,
                 overwrite: bool = False, write_behind: bool = False) -> None:
        """Claims `path` (see traces.trace_dir): a directory holding a trace is refused unless `overwrite`,
        and one another writer holds is refused always."""
        self.stream_format = stream_format or ("arrow" if flush_every > 1 else "jsonl")
        if self.stream_format not in STREAM_FORMATS:
            raise ValueError(f"stream_format: must be one of {', '.join(STREAM_FORMATS)}, got {stream_format!r}")
        self.lock = TraceDirLock(path, overwrite)
        self.path = self.lock.path
        self.lock.remove_old_trace()
        self.meta = {"format_version": FORMAT_VERSION, **meta, "versions": package_versions(),
                     "started_at": time.time(), "complete": False}
        self._write_meta()
        self.columns = {t: (*cols, *OPTIONAL_COLUMNS.get(t, ()), *extra_int_columns) for t, cols in TABLES.items()}
        self._buf: dict[str, dict[str, list[Any]]] = {t: {c: [] for c in cols} for t, cols in self.columns.items()}
        self._order = sorted(self._buf, key=lambda t: t == "steps")  # the steps table last: its row marks a step whole
        self._rows: dict[str, list[tuple[object, ...]]] = {}
        self._runs: dict[str, tuple[RunSpec | GridSpec, list[RunEntry]]] = {}
        self._files: dict[str, BinaryIO] = {}
        self._streams: dict[str, Any] = {}
        if self.stream_format == "jsonl":
            self._files = {t: open(open_new_nofollow(self.path / stream_file(t), append=True), "ab")
                           for t in TABLES}
        else:
            import pyarrow as pa

            for t in TABLES:
                schema = arrow_schema(t, extra_int_columns)
                os.close(open_new_nofollow(self.path / arrow_stream_file(t)))  # a link there is refused, not followed
                sink = pa.OSFile(str(self.path / arrow_stream_file(t)), "wb")
                self._streams[t] = (sink, pa.ipc.new_stream(sink, schema), schema)
        self.flush_every = flush_every
        self.extra_int_columns = extra_int_columns
        self._steps_since_flush = 0
        self.closed = False
        # Write-behind: rows handed over per flush, in order, through the C queue (a put costs the step
        # well under a microsecond); at most MAX_HANDED flushes wait, so a disk that falls behind slows the
        # steps down instead of filling memory. A write error waits here for the next flush.
        self._handed: queue.SimpleQueue[list[_Pending] | None] | None = queue.SimpleQueue() if write_behind else None
        self._thread: threading.Thread | None = None
        self._handed_at = -math.inf
        self._failure: BaseException | None = None  # raised once, at the next flush or close
        self._failed = False  # the writer thread writes nothing more

    def _write_meta(self) -> None:
        with self._writing(META_FILE), replaced_when_done(self.path / META_FILE) as tmp:
            tmp.write_text(json.dumps(self.meta, indent=2, default=str))

    @contextmanager
    def _writing(self, what: str, kept: str = "every step written before it stays readable") -> Iterator[None]:
        """An OS error while writing ends the trace there, in one line: the streams are closed as they
        stand, the directory released, and nothing is compacted (that would need the room that ran out)."""
        try:
            yield
        except OSError as e:
            self._abandon()
            raise TraceWriteError(f"{self.path}: cannot write {what} ({e.strerror or e}); the trace ends here and "
                                  f"{kept}") from None

    def _abandon(self) -> None:
        """Close every stream without another write that could fail, and give up the directory."""
        self.closed = True
        for f in self._files.values():
            with suppress(Exception):
                f.close()
        for sink, stream, _ in self._streams.values():
            with suppress(Exception):
                stream.close()
            with suppress(Exception):
                sink.close()
        self.lock.release()

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Rows as dicts; a column a row lacks is null, keys outside the table's columns are dropped."""
        if rows:
            for c, values in self._buf[table].items():
                values.extend([r.get(c) for r in rows])

    def buffer(self, table: str) -> dict[str, list[Any]]:
        """The table's pending rows as one list per column, for a caller to append to in place (the
        recorder: no object per row). Append to every column alike; a column left short (an extra
        column the caller does not know) is filled with nulls when the rows are written."""
        return self._buf[table]

    def row_buffer(self, table: str) -> list[tuple[object, ...]]:
        """The table's pending rows as tuples of its first columns in order, turned into columns at the
        next drain: one tuple per row costs a caller far less than one append per column (the steps
        table, a row per simulated step). Rows here come after the ones appended to `buffer(table)`."""
        return self._rows.setdefault(table, [])

    def run_buffer(self, table: str, spec: RunSpec | GridSpec) -> list[RunEntry] | None:
        """The table's pending row runs (`traces.runs`), for a caller to append to; None where the
        stream is JSON lines (one step per flush: nothing to gain). Runs go out with the buffered rows,
        each at its position among them."""
        if self.stream_format != "arrow":
            return None
        self._runs[table] = (spec, [])
        return self._runs[table][1]

    def flush(self, steps: int = 1) -> None:
        """Called after each step (or run of `steps` steps): every `flush_every` steps the rows go to the
        OS, after which a SIGKILL loses nothing of them. With write-behind they go to the writer thread, at
        most every HANDOFF_S: a hand-off per step woke the thread, and cost the step its interpreter lock,
        for every few rows (rows handed over were never safe from a SIGKILL either until written)."""
        self._steps_since_flush += steps
        if self._steps_since_flush >= self.flush_every:
            if self._handed is not None:
                now = time.monotonic()
                if now - self._handed_at < self.HANDOFF_S:
                    return
                self._handed_at = now
            self.drain()

    def drain(self) -> None:
        """Write out every buffered row now, the steps table last (a step's row marks it complete); with
        write-behind, hand them to the writer thread."""
        self._steps_since_flush = 0
        handed_queue = self._handed
        if handed_queue is None:
            for table, cols, spec, runs in self._pending():
                self._write(table, cols, spec, runs)
                for values in cols.values():
                    values.clear()
            return
        self._raise_failure()
        handed: list[_Pending] = []
        for table, cols, spec, runs in self._pending():
            # Copies: the recorder goes on appending to the buffers' own lists while the thread writes.
            handed.append((table, {c: v[:] for c, v in cols.items()}, spec, runs[:] if runs else None))
            for values in cols.values():
                values.clear()
            if runs:
                runs.clear()
        if not handed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_behind, args=(handed_queue,), name="trace-writer",
                                            daemon=True)
            self._thread.start()
        while handed_queue.qsize() >= self.MAX_HANDED and self._thread.is_alive():
            time.sleep(0.001)
        handed_queue.put(handed)

    def _pending(self) -> Iterator[_Pending]:
        """(table, columns, run spec, runs) of every table with rows to write, steps last, each table's
        row tuples folded into its columns and its columns padded to one length."""
        for table in self._order:
            cols = self._buf[table]
            rows = self._rows.get(table)
            if rows:
                for column_values, column in zip(zip(*rows), cols.values()):
                    column.extend(column_values)
                rows.clear()
            n = max(map(len, cols.values()))
            spec, runs = self._runs.get(table, (None, None))
            if not (n or runs):
                continue
            for values in cols.values():
                if len(values) < n:
                    values.extend([None] * (n - len(values)))
            yield table, cols, spec, runs

    def _write(self, table: str, cols: dict[str, list[Any]], spec: RunSpec | GridSpec | None,
               runs: list[RunEntry] | None) -> None:
        """One table's rows (and row runs) to its stream."""
        if self._files:
            keys = self.columns[table]
            f = self._files[table]
            with self._writing(stream_file(table)):
                f.write(b"\n".join([_dumps(dict(zip(keys, row))) for row in zip(*cols.values())]) + b"\n")
                f.flush()
            return
        sink, stream, schema = self._streams[table]
        batch = to_batch(cols, schema) if max(map(len, cols.values())) else None
        if runs and spec is not None:
            batch = merge_runs(batch, spec.batch(runs, schema), [r[0] for r in runs], [r[1] for r in runs])
            runs.clear()
        with self._writing(arrow_stream_file(table)):
            stream.write_batch(batch)
            sink.flush()

    def _write_behind(self, handed_queue: queue.SimpleQueue[list[_Pending] | None]) -> None:
        """The writer thread: what each flush handed over, in order, until close hands it None. After a
        failure it writes nothing more (the trace ends at the last step written whole)."""
        while (handed := handed_queue.get()) is not None:
            if self._failed:
                continue
            try:
                for table, cols, spec, runs in handed:
                    self._write(table, cols, spec, runs)
            except Exception as e:
                self._failed = True
                if not self.closed or isinstance(e, TraceWriteError):  # not a stream closed under it
                    self._failure = e

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _join_writer(self) -> None:
        """Wait until the writer thread has written everything handed to it, then raise its failure."""
        if self._thread is not None and self._handed is not None:
            self._handed.put(None)
            self._thread.join()
            self._thread = None
        self._raise_failure()

    def update_meta(self, **fields: Any) -> None:
        self.meta.update(fields)
        self._write_meta()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        """Finish the trace: close streams, compact them to Parquet, mark meta complete."""
        if self.closed:
            self._raise_failure()
            return
        self.drain()
        if self._handed is not None:
            self._join_writer()
        try:
            with self._writing("the streams"):
                for f in self._files.values():
                    f.close()
                for sink, stream, _ in self._streams.values():
                    stream.close()
                    sink.close()
            self.closed = True
            if compact:
                with self._writing("Parquet (compacting)", "it stays readable from the streams not yet compacted"):
                    if self._streams:
                        self._compact_arrow()
                    else:
                        self._compact()
            self.update_meta(complete=True, ended_at=time.time(), **final_meta)
        except BaseException:  # a write error or a second Ctrl-C: what is on disk stays, the directory is let go
            self._abandon()
            raise
        self.lock.release()

    def _compact_arrow(self) -> None:
        """Arrow streams -> Parquet: a copy of the batches, nothing to parse. Two tables at a time, the
        largest first: Arrow reads and Parquet encodes without the GIL, so a second core shortens the
        wait, for a second row group in memory."""
        from concurrent.futures import ThreadPoolExecutor

        streams = {table: self.path / arrow_stream_file(table) for table in TABLES}

        def compact(table: str) -> None:
            arrow_stream_to_parquet(streams[table], self.path / parquet_file(table))
            streams[table].unlink()

        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(compact, sorted(TABLES, key=lambda t: -streams[t].stat().st_size)))  # re-raises errors

    def _compact(self) -> None:
        """JSON lines -> Parquet streamed through Arrow in batches, so memory stays flat for millions of
        rows; a table Arrow cannot parse falls back to pandas. Each Parquet file is written under a
        temporary name and renamed into place, so a kill mid-compaction leaves the JSON lines in charge."""
        import pyarrow.json as pj
        import pyarrow.parquet as pq

        from traces.streams import read_stream

        for table, columns in TABLES.items():
            src, dst = self.path / stream_file(table), self.path / parquet_file(table)
            with replaced_when_done(dst) as tmp:
                try:
                    if src.stat().st_size == 0:
                        raise ValueError("empty stream")
                    schema = arrow_schema(table, self.extra_int_columns)
                    # Small blocks: Arrow reads ahead several of them, so their size sets compaction's peak memory.
                    reader = pj.open_json(src, read_options=pj.ReadOptions(block_size=4 << 20),
                                          parse_options=pj.ParseOptions(explicit_schema=schema))
                    with pq.ParquetWriter(tmp, reader.schema) as out:
                        for batch in reader:
                            out.write_batch(batch)
                except ValueError:  # pyarrow.ArrowInvalid: rows the schema cannot type
                    df, _ = read_stream(src, table, columns, self.extra_int_columns)
                    df.to_parquet(tmp, index=False)
            src.unlink()
