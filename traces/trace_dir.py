"""A trace directory has one writer, and a trace already in it is never replaced unless asked: the writer
holds an exclusive lock (flock on `.writer.lock`, released by the kernel if the process dies) for its
whole life, and refuses a directory that holds a trace unless `overwrite`. A directory holds a trace only
when its meta.json reads as one: files that merely carry a trace's names are someone else's, never
removed. Readers never lock."""
from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

from traces.arrowstream import arrow_stream_file
from traces.errors import TraceError
from traces.outputs import Output, check_outputs
from traces.schema import META_FILE, SPANS_FILE, TABLES, TEMP_SUFFIX, parquet_file, stream_file

LOCK_FILE = ".writer.lock"
TRACE_FILE_NAMES = (META_FILE, SPANS_FILE,
                    *(n for t in TABLES for n in (stream_file(t), arrow_stream_file(t), parquet_file(t))))


class TraceDirError(TraceError):
    """A trace directory that cannot be written: one line naming it and why."""


class TraceWriteError(TraceDirError):
    """The file system refused a write midway (full, read-only, over quota): the trace ends there, with
    every row written before it still readable."""


def holds_trace(path: Path) -> bool:
    """Whether `path` holds a trace of ours: its meta.json reads as one (bounded, any format check)."""
    from traces.meta import read_meta

    try:
        read_meta(path)
    except (TraceError, OSError):
        return False
    return True


def trace_files(path: Path) -> list[Path]:
    """The files a trace in `path` has (meta, spans, each table's streams and Parquet file), links
    included (`lexists`): empty unless `path` holds a trace."""
    if not holds_trace(path):
        return []
    return [path / n for n in TRACE_FILE_NAMES if os.path.lexists(path / n)]


def _claimable(path: Path, overwrite: bool) -> list[Path]:
    """The old trace's files `overwrite` may remove; a one-line refusal for a trace kept, a link among a
    trace's names, or another's files a trace would replace."""
    named = [path / n for n in TRACE_FILE_NAMES if os.path.lexists(path / n)]
    links = [p for p in named if p.is_symlink()]
    if links:
        raise TraceDirError(f"{links[0]}: is a symbolic link; a trace directory's files are never written "
                            "through links (remove it, or name another directory)")
    if not named:
        return []
    if not holds_trace(path):
        raise TraceDirError(f"{path}: holds {named[0].name} but no trace (its {META_FILE} is not a trace's); "
                            "these files are not stepscope's to replace: name another directory")
    if not overwrite:
        raise TraceDirError(f"{path}: holds a trace already ({named[0].name}, ...); pass --overwrite to "
                            "replace it, or name another directory")
    return named


class TraceDirLock:
    """The claim on one directory; `release()` when the trace is finished. The lock file is unlinked only
    by its holder, before it unlocks; a taker checks that the file it locked is still the one at the path
    (else another has since taken a new one), so two writers never both hold the directory."""

    def __init__(self, path: str | Path, overwrite: bool = False) -> None:
        check_outputs([Output("trace directory", path, owns=True)], ())
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise TraceDirError(f"{self.path}: exists and is not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TraceDirError(f"{self.path}: cannot write a trace here ({e.strerror})") from None
        self.fd = self._lock()
        try:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, str(os.getpid()).encode())
            self.old_files = _claimable(self.path, overwrite)
        except BaseException:
            self.release()
            raise

    def _lock(self) -> int:
        lock = self.path / LOCK_FILE
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise TraceDirError(f"{lock}: is a symbolic link; a trace directory's lock is never taken "
                                        "through a link") from None
                raise TraceDirError(f"{self.path}: cannot write a trace here ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise TraceDirError(f"{self.path}: another writer (pid {holder}) is writing a trace here") from None
            try:
                at_path = os.lstat(lock)
            except FileNotFoundError:
                at_path = None
            mine = os.fstat(fd)
            if at_path is not None and (at_path.st_dev, at_path.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
            os.close(fd)  # its holder removed it as we locked it: take the one at the path now

    def remove_old_trace(self) -> None:
        """The previous trace's files (only a real trace's, only with overwrite), and temporary files a
        killed compaction left."""
        for old in self.old_files:
            old.unlink(missing_ok=True)
        for table in TABLES:
            for stale in self.path.glob(f"{parquet_file(table)}.*{TEMP_SUFFIX}"):
                stale.unlink(missing_ok=True)

    def release(self) -> None:
        if self.fd < 0:
            return
        (self.path / LOCK_FILE).unlink(missing_ok=True)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = -1


def check_trace_output(path: str | Path, overwrite: bool, inputs: Iterable[str | Path | None],
                       flag: str = "--trace") -> None:
    """Refuse now, before any work is done, a trace directory the writer would refuse later, or one that
    is, holds or lies inside one of the command's inputs."""
    check_outputs([Output(flag, path, owns=True)], inputs)
    TraceDirLock(path, overwrite).release()
