"""Streaming trace writer: one JSON line per row, handed to the OS every `flush_every` steps (every step
for the engine), steps table last, so a run killed at any moment leaves every flushed step readable;
`close()` compacts the streams to Parquet."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from traces.schema import FORMAT_VERSION, META_FILE, TABLES, TEMP_SUFFIX, arrow_schema, parquet_file, stream_file

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # numpy scalars from cost models and tables are plain numbers here


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
    """Owns a trace directory; rows go to `<table>.jsonl` until `close()` turns them into Parquet.

    The simulator passes a larger `flush_every`: a system call per table per simulated step would
    dominate the step itself."""

    def __init__(self, path: str | Path, meta: dict[str, Any], flush_every: int = 1,
                 extra_int_columns: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            for name in (stream_file(table), parquet_file(table)):
                (self.path / name).unlink(missing_ok=True)
            for stale in self.path.glob(f"{parquet_file(table)}.*{TEMP_SUFFIX}"):
                stale.unlink(missing_ok=True)
        self.meta = {"format_version": FORMAT_VERSION, **meta, "versions": package_versions(),
                     "started_at": time.time(), "complete": False}
        self._write_meta()
        self._files: dict[str, BinaryIO] = {t: open(self.path / stream_file(t), "ab") for t in TABLES}
        self._buf: dict[str, list[bytes]] = {t: [] for t in TABLES}
        self.flush_every = flush_every
        self.extra_int_columns = extra_int_columns
        self._steps_since_flush = 0
        self.closed = False

    def _write_meta(self) -> None:
        tmp = self.path / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2, default=str))
        os.replace(tmp, self.path / META_FILE)

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._buf[table].append(b"\n".join(map(_dumps, rows)) + b"\n")

    def flush(self) -> None:
        """Called once per step: every `flush_every` steps the rows go to the OS, after which a SIGKILL
        loses nothing of them."""
        self._steps_since_flush += 1
        if self._steps_since_flush >= self.flush_every:
            self.drain()

    def drain(self) -> None:
        """Write out every buffered row now, the steps table last (a step's row marks it complete)."""
        self._steps_since_flush = 0
        for table in sorted(self._buf, key=lambda t: t == "steps"):
            buf = self._buf[table]
            if buf:
                f = self._files[table]
                f.write(b"".join(buf))
                f.flush()
                buf.clear()

    def update_meta(self, **fields: Any) -> None:
        self.meta.update(fields)
        self._write_meta()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        """Finish the trace: close streams, compact them to Parquet, mark meta complete."""
        if self.closed:
            return
        self.drain()
        self.closed = True
        for f in self._files.values():
            f.close()
        if compact:
            self._compact()
        self.update_meta(complete=True, ended_at=time.time(), **final_meta)

    def _compact(self) -> None:
        """JSON lines -> Parquet streamed through Arrow in batches, so memory stays flat for millions of
        rows; a table Arrow cannot parse falls back to pandas. Each Parquet file is written under a
        temporary name and renamed into place, so a kill mid-compaction leaves the JSON lines in charge."""
        import pyarrow.json as pj
        import pyarrow.parquet as pq

        from traces.streams import read_stream

        for table, columns in TABLES.items():
            src, dst = self.path / stream_file(table), self.path / parquet_file(table)
            tmp = dst.with_name(f"{dst.name}.{os.getpid()}{TEMP_SUFFIX}")
            try:
                if src.stat().st_size == 0:
                    raise ValueError("empty stream")
                schema = arrow_schema(table, self.extra_int_columns)
                reader = pj.open_json(src, read_options=pj.ReadOptions(block_size=16 << 20),
                                      parse_options=pj.ParseOptions(explicit_schema=schema))
                with pq.ParquetWriter(tmp, reader.schema) as out:
                    for batch in reader:
                        out.write_batch(batch)
            except (ValueError, OSError):
                df, _ = read_stream(src, table, columns, self.extra_int_columns)
                df.to_parquet(tmp, index=False)
            os.replace(tmp, dst)
            src.unlink()
