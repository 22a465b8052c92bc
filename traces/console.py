"""Every command's edge (`engine`, `sim`, `python -m traces`, `tui`), written once: a bad flag, a damaged
trace, bad input or a closed stdout ends in one line on stderr and exit status 2, trace warnings are one
line of our own, and SIGTERM ends a run as Ctrl-C does (its trace closed whole), with exit status 143."""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True, slots=True)
class Command:
    """What a parsed command line runs; `prog` (`sim replay`) names it in its one-line errors."""

    prog: str
    run: Run


def command(parser: argparse.ArgumentParser, run: Run | None = None) -> argparse.ArgumentParser:
    """Declare what `parser` (a program, or one of its subcommands) runs on its parsed flags; without
    `run`, its help (a program given no subcommand). A subcommand's declaration overrides its program's."""
    parser.set_defaults(command_=Command(parser.prog, run or _help(parser)))
    return parser


def _help(parser: argparse.ArgumentParser) -> Run:
    def show(args: argparse.Namespace) -> int:
        parser.print_help()
        return 0
    return show


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
                errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """Parse `argv` and run the command `parser` declares (`command`) inside `run_cli`. A bad flag is the
    parser's one line (engine.core.flags.OneLineParser) and exit status 2; --help exits 0."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    chosen: Command = args.command_
    return run_cli(chosen.prog, lambda: chosen.run(args), errors)


def run_cli(prog: str, body: Callable[[], int], errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """Run `body` as command `prog`: `errors` (and OS errors) become
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
