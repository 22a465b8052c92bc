"""What a trace reader or writer raises and warns: here, below every other traces module, so any of them
(the output rule included) can raise it without importing the reader."""
from __future__ import annotations


class TraceError(ValueError):
    """A directory that is not a readable trace; the message is one line naming the path."""


class TraceWarning(UserWarning):
    """Something of a trace was read around (shown as one line by the command-line tools)."""
