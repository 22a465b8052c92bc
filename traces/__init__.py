"""The trace directory format (torch-free): a streaming writer, `load` into pandas, block-pool
reconstruction, summaries and exporters. See FORMAT.md.

The reader and writer (pandas, pyarrow) load on first use, so a command that only checks its arguments,
or refuses an existing trace, answers before they do."""
from typing import TYPE_CHECKING, Any

from traces.errors import TraceError, TraceWarning
from traces.schema import FORMAT_VERSION

if TYPE_CHECKING:
    from traces.reader import Trace, TruncatedTraceWarning, load
    from traces.writer import TraceWriter

_LAZY = {"Trace": "traces.reader", "load": "traces.reader", "TruncatedTraceWarning": "traces.reader",
         "TraceWriter": "traces.writer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'traces' has no attribute {name!r}")


__all__ = ["FORMAT_VERSION", "Trace", "TraceError", "TraceWarning", "TraceWriter", "TruncatedTraceWarning", "load"]
