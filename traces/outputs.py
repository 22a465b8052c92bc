"""One rule for every path a command writes (trace directories, exports, profiles, results, plots): never
onto, over or inside one of the command's own inputs, never renamed over something that is not a regular
file, never through a link inside a trace directory, and checked before any work starts."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from traces.errors import TraceError
from traces.schema import TEMP_SUFFIX


class OutputError(TraceError):
    """An output that would land on something not its own: one line naming the flag, the path and why."""


@dataclass(frozen=True, slots=True)
class Output:
    """A path a command writes, `flag` naming it in messages: a file; a `directory` of files the command
    names (plots), which may hold other things; or a directory it `owns` whole (a trace), which may then
    hold none of the command's inputs."""

    flag: str
    path: str | Path
    directory: bool = False
    owns: bool = False


def resolved(path: str | Path, flag: str) -> Path:
    """The real path (links followed, `..` removed); a link loop is one line, not an OSError later."""
    try:
        return Path(os.path.realpath(path, strict=False))
    except (OSError, RuntimeError) as e:
        raise OutputError(f"{flag} {path}: cannot be resolved ({getattr(e, 'strerror', None) or e})") from None


def _is_loop(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as e:
        import errno

        return e.errno == errno.ELOOP
    return False


def _same(a: Path, b: Path) -> bool:
    """The same file by path, or by inode where both exist (a hard link, a bind mount)."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(inner: Path, outer: Path) -> bool:
    return inner != outer and inner.is_relative_to(outer)


def existing_paths(*values: str | None) -> list[str]:
    """The values of flags that take a name or a path (a preset or a file) that are paths: inputs."""
    return [v for v in values if v is not None and os.path.exists(v)]


def check_outputs(outputs: Iterable[Output], inputs: Iterable[str | Path | None]) -> None:
    """Refuse, in one line, an output that is one of `inputs`, contains one (a directory output) or lies
    inside one; and a file output that exists as something a file cannot be written over."""
    ins = [(str(p), resolved(p, "input")) for p in inputs if p is not None and str(p) != ""]
    for out in outputs:
        if str(out.path).strip() == "":
            raise OutputError(f"{out.flag}: the path is empty; name a {'directory' if out.directory else 'file'}")
        if _is_loop(Path(out.path)):
            raise OutputError(f"{out.flag} {out.path}: is a loop of symbolic links")
        real = resolved(out.path, out.flag)
        for given, inp in ins:
            if _same(real, inp):
                why = "is"
            elif out.owns and _inside(inp, real):
                why = "contains"
            elif _inside(real, inp):
                why = "lies inside"
            else:
                continue
            raise OutputError(f"{out.flag} {out.path}: {why} {given}, one of the command's own inputs; name "
                              "another path")
        if out.directory or out.owns:
            if os.path.exists(real) and not real.is_dir():
                raise OutputError(f"{out.flag} {out.path}: exists and is not a directory")
        else:
            writable_target(Path(out.path), out.flag)


def writable_target(path: Path, flag: str) -> bool:
    """Whether `path` is a stream to write into as it is (a device or a pipe) rather than a file to
    replace; a directory, a socket or anything else that is not a regular file is one line."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot be written ({e.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        return False
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return True
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    raise OutputError(f"{flag} {path}: is {kind}; name a file to write")


@contextmanager
def replaced_when_done(dst: Path, flag: str = "output") -> Iterator[Path]:
    """Yields the path to write; `dst` appears only once the block ends without an exception, under a
    temporary name beside it until then, so an error, a full disk or a second Ctrl-C leaves no half file.
    A link named by the user is followed (the file it names is replaced); a device or a pipe is written
    as a stream, never renamed over."""
    dst = Path(dst)
    if os.path.islink(dst):
        dst = resolved(dst, flag)
    if writable_target(dst, flag):
        yield dst
        return
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}{TEMP_SUFFIX}")
    tmp.unlink(missing_ok=True)  # a link left at the temporary name is removed, never written through
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_new_nofollow(path: Path, append: bool = False) -> int:
    """A file descriptor to write `path` inside a trace directory: a link there is refused (ELOOP), never
    followed to wherever it points."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    try:
        return os.open(path, flags, 0o644)
    except OSError as e:
        import errno

        if e.errno == errno.ELOOP:
            raise OutputError(f"{path}: is a symbolic link; a trace directory's files are never written "
                              "through links") from None
        raise


class Figure(Protocol):
    def savefig(self, fname: Any, *, format: str, dpi: int) -> None: ...


def save_png(fig: Figure, path: Path, dpi: int = 100) -> None:
    """A plot written whole or not at all, under the same rule as every other output."""
    with replaced_when_done(path, "--plots") as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
