"""A trace directory has one writer, and a trace already in it is never replaced unless asked: the writer
holds an exclusive lock (flock on `.writer.lock`, released by the kernel if the process dies) for its
whole life, and refuses a directory that holds a trace unless `overwrite`. Readers never lock."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from traces.reader import TraceError
from traces.schema import META_FILE, SPANS_FILE, TABLES, parquet_file, stream_file

LOCK_FILE = ".writer.lock"


class TraceDirError(TraceError):
    """A trace directory that cannot be written: one line naming it and why."""


class TraceWriteError(TraceDirError):
    """The file system refused a write midway (full, read-only, over quota): the trace ends there, with
    every row written before it still readable."""


def trace_files(path: Path) -> list[Path]:
    """The files of a trace in `path` (meta, spans, each table's streams and Parquet file)."""
    from traces.arrowstream import arrow_stream_file

    names = [META_FILE, SPANS_FILE, *(n for t in TABLES for n in (stream_file(t), arrow_stream_file(t), parquet_file(t)))]
    return [path / n for n in names if (path / n).exists()]


class TraceDirLock:
    """The claim on one directory; `release()` when the trace is finished."""

    def __init__(self, path: str | Path, overwrite: bool = False) -> None:
        if str(path).strip() == "":
            raise TraceDirError("trace directory: the path is empty; name a directory for the trace")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise TraceDirError(f"{self.path}: exists and is not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise TraceDirError(f"{self.path}: cannot write a trace here ({e.strerror})") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise TraceDirError(f"{self.path}: another writer (pid {holder}) is writing a trace here") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        existing = trace_files(self.path)
        if existing and not overwrite:
            self.release()
            raise TraceDirError(f"{self.path}: holds a trace already ({existing[0].name}, ...); pass --overwrite to "
                                "replace it, or name another directory")

    def release(self) -> None:
        if self.fd < 0:
            return
        (self.path / LOCK_FILE).unlink(missing_ok=True)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = -1
