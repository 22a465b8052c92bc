"""What every reader entry point (`python -m traces`, `sim`, `tui`) does at its edges: trace warnings as one
line of our own, and an ending of one line and exit status 2 for a damaged trace or a closed stdout."""
from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from traces.errors import TraceWarning

_python_showwarning = warnings.showwarning


def _show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:
    if issubclass(category, TraceWarning):
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def one_line_warnings() -> None:
    """Show TraceWarnings as `warning: <message>` instead of Python's two-line file:line format."""
    warnings.showwarning = _show


def first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def trace_line(path: Any) -> str:
    """The last line of every command that wrote a trace: where it is, and the command that opens it."""
    return f"trace: {path}  (open it: tui {shlex.quote(str(path))})"


SIGTERM_STATUS = 128 + signal.SIGTERM


class _Sigterm:
    """SIGTERM (kill, timeout, docker stop, systemd) raised as the KeyboardInterrupt Ctrl-C raises, so a
    run ends the same way (its trace closed whole), and remembered, so the exit status says which."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.received = True
        raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.received = False
        previous = signal.signal(signal.SIGTERM, self)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


_sigterm = _Sigterm()


def run_cli(prog: str, body: Callable[[], int], errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """Every command's edge (`engine`, `sim`, `python -m traces`, `tui`): `errors` (and OS errors) become
    `PROG: error: ...` and exit 2; a reader that went away (`| head`) is one line too, not a BrokenPipeError
    traceback at exit; a Ctrl-C that reaches here (a second one, while a trace is closed) is one line and
    exit 130; a run ended by SIGTERM exits 143 whichever way it ended."""
    with _sigterm.installed():
        rc = _run(prog, body, errors)
    return SIGTERM_STATUS if _sigterm.received else rc


def _run(prog: str, body: Callable[[], int], errors: tuple[type[BaseException], ...]) -> int:
    one_line_warnings()
    try:
        rc = body()
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit finds nothing to complain about.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"{prog}: error: <stdout>: closed before all output was written (broken pipe)", file=sys.stderr)
        return 2
    except errors as e:
        print(f"{prog}: error: {first_line(e)}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"{prog}: error: input is not UTF-8 ({first_line(e)})", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {where}{e.strerror or first_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; a trace keeps what was written before", file=sys.stderr)
        return 130
