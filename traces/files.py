"""A file written in full or not at all: under a temporary name beside it, renamed into place at the
end, and removed if anything (an error, a full disk, a second Ctrl-C) stops the writing midway."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from traces.schema import TEMP_SUFFIX


@contextmanager
def replaced_when_done(dst: Path) -> Iterator[Path]:
    """Yields the temporary path to write; `dst` appears only once the block ends without an exception."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
