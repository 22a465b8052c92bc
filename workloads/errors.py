"""WorkloadError and the translation of pydantic / YAML failures into one line a user can act on."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError


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


def _describe(err: dict) -> tuple[str, str]:
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


def from_validation_error(exc: ValidationError, source: str | Path, data: Any) -> WorkloadError:
    """The first pydantic error as a WorkloadError (a count of the others is appended)."""
    errors = exc.errors()
    first = errors[0]
    suffix, what = _describe(first)
    path = _field_path(tuple(first["loc"]), data) + suffix
    if path.startswith("(top level)."):
        path = path.removeprefix("(top level).")
    if len(errors) > 1:
        what += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return WorkloadError(source, path, what)
