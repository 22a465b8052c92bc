"""WorkloadError and the translation of pydantic / YAML failures into one line a user can act on."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails


class WorkloadError(ValueError):
    """A bad workload or trace file; str() is one line, `<file>: <field.path>: <what is wrong>`."""

    def __init__(self, source: str | Path, field: str, what: str) -> None:
        self.source, self.field, self.what = str(source), field, " ".join(str(what).split())
        super().__init__(f"{self.source}: {self.field}: {self.what}")


def _field_path(loc: tuple, data: Any) -> str:
    """Join pydantic's loc into `arrival.rate`, dropping the union tags (`gamma`) it inserts."""
    out: list[str] = []
    node = data
    for part in loc:
        if isinstance(part, int):
            out[-1:] = [f"{out[-1] if out else ''}[{part}]"]
            node = node[part] if isinstance(node, list) and part < len(node) else None
            continue
        if isinstance(node, dict) and part not in node and part in (node.get("process"), node.get("dist")):
            continue
        out.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return ".".join(out) or "(top level)"


def _describe(err: ErrorDetails) -> tuple[str, str]:
    """(suffix to add to the path, message) for one pydantic error dict."""
    kind, ctx, msg = err["type"], err.get("ctx") or {}, err["msg"]
    disc = str(ctx.get("discriminator", "")).strip("'")
    if kind == "union_tag_invalid":
        return f".{disc}", f"unknown {disc} {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    if kind in ("union_tag_not_found", "missing"):
        return (f".{disc}" if kind == "union_tag_not_found" else ""), "is required"
    if kind == "extra_forbidden":
        return "", "unknown field (a typo?)"
    if kind == "value_error":
        return "", msg.removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, (int, float, str, bool)) or value is None:
        msg = f"{msg} (got {value!r})"
    return "", msg


MAX_LISTED = 10  # problems listed in the one line; past them, a count


def _problem(err: ErrorDetails, data: Any) -> tuple[str, str]:
    """(field path, what is wrong) of one pydantic error."""
    suffix, what = _describe(err)
    path = _field_path(tuple(err["loc"]), data) + suffix
    return path.removeprefix("(top level)."), what


def from_validation_error(exc: ValidationError, source: str | Path, data: Any) -> WorkloadError:
    """Every pydantic error in one line: the first as the error's field, the others after it, so that
    one fix-and-rerun mends them all."""
    problems = [_problem(err, data) for err in exc.errors()]
    path, what = problems[0]
    if len(problems) > 1:
        what += "".join(f"; {p}: {w}" for p, w in problems[1:MAX_LISTED])
    if len(problems) > MAX_LISTED:
        what += f"; and {len(problems) - MAX_LISTED} more"
    return WorkloadError(source, path, what)
