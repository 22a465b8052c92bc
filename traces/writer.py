"""Streaming trace writer: one JSON line per row, flushed after every step, so a run killed at any
moment leaves every completed step readable; `close()` compacts the streams to Parquet."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from traces.schema import FORMAT_VERSION, META_FILE, TABLES, parquet_file, stream_file

_encode = json.JSONEncoder(separators=(",", ":")).encode


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
    """Owns a trace directory; rows go to `<table>.jsonl` until `close()` turns them into Parquet."""

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            for name in (stream_file(table), parquet_file(table)):
                (self.path / name).unlink(missing_ok=True)
        self.meta = {"format_version": FORMAT_VERSION, **meta, "versions": package_versions(),
                     "started_at": time.time(), "complete": False}
        self._write_meta()
        self._files: dict[str, TextIO] = {t: open(self.path / stream_file(t), "a", encoding="utf-8")
                                          for t in TABLES}
        self.closed = False

    def _write_meta(self) -> None:
        tmp = self.path / (META_FILE + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2, default=str))
        os.replace(tmp, self.path / META_FILE)

    def write_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._files[table].write("\n".join(map(_encode, rows)) + "\n")

    def flush(self) -> None:
        """Push buffered rows to the OS: after this a SIGKILL loses nothing already written."""
        for f in self._files.values():
            f.flush()

    def update_meta(self, **fields: Any) -> None:
        self.meta.update(fields)
        self._write_meta()

    def close(self, compact: bool = True, **final_meta: Any) -> None:
        """Finish the trace: close streams, compact them to Parquet, mark meta complete."""
        if self.closed:
            return
        self.closed = True
        for f in self._files.values():
            f.close()
        if compact:
            self._compact()
        self.update_meta(complete=True, ended_at=time.time(), **final_meta)

    def _compact(self) -> None:
        from traces.reader import read_stream

        for table, columns in TABLES.items():
            src = self.path / stream_file(table)
            df, _ = read_stream(src, columns)
            df.to_parquet(self.path / parquet_file(table), index=False)
            src.unlink()
