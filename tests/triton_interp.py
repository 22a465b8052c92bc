"""Triton's CPU interpreter for a test module: TRITON_INTERPRET=1 is read when a kernel is decorated, so
the modules that define kernels are reloaded under it, and reloaded again once the variable is restored."""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

TRITON_MODULES = ("triton.language.standard", "triton.language.random", "triton.language")


def redecorate(modules: tuple[str, ...]) -> None:
    for name in (*TRITON_MODULES, *modules):
        importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)


@contextmanager
def interpreted(modules: tuple[str, ...]) -> Iterator[None]:
    """`modules`' kernels built by the interpreter inside the block; as they were after it."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    redecorate(modules)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
        redecorate(modules)
