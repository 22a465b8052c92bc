"""Which skips CI allows: only CUDA-only (`gpu`-marked) and flash-attn tests may skip there. A test that
skips because a Python package is missing means the test extras lack it, and a green run would hide that."""
from __future__ import annotations

import re
from collections.abc import Iterable

_ALLOWED = re.compile(r"cuda|flash[-_ ]?attn", re.IGNORECASE)
_MISSING = (
    re.compile(r"could not import '([\w.]+)'"),   # pytest.importorskip
    re.compile(r"No module named '([\w.]+)'"),
    re.compile(r"^([\w.-]+) is not installed"),    # skipif(find_spec(...) is None, reason="X is not installed")
)


def skip_reason(longrepr: object) -> str:
    """The reason text of a skip report (pytest keeps it as (path, line, 'Skipped: reason'))."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def missing_package(reason: str) -> str | None:
    for pattern in _MISSING:
        m = pattern.search(reason)
        if m:
            return m.group(1)
    return None


def ci_violation(nodeid: str, reason: str, keywords: Iterable[str]) -> str | None:
    """One line saying why this skip fails CI, or None when CI allows it."""
    if "gpu" in keywords or _ALLOWED.search(reason):
        return None
    package = missing_package(reason)
    if package is not None:
        return f"{nodeid}: skipped because package '{package}' is missing; the test extras must install it"
    return f"{nodeid}: skipped ({reason}); in CI only CUDA-only and flash-attn tests may skip"
