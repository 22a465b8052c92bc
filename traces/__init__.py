"""The trace directory format (torch-free): a streaming writer, `load` into pandas, block-pool
reconstruction, summaries and exporters. See FORMAT.md."""
from traces.reader import Trace, TraceError, TraceWarning, TruncatedTraceWarning, load
from traces.schema import FORMAT_VERSION
from traces.writer import TraceWriter

__all__ = ["FORMAT_VERSION", "Trace", "TraceError", "TraceWarning", "TraceWriter", "TruncatedTraceWarning", "load"]
