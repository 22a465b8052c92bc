"""Spans as OTLP JSON lines: one ExportTraceServiceRequest per line, as the OpenTelemetry collector's
file exporter writes them; read back into a flat DataFrame."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

SPAN_COLUMNS = ("name", "trace_id", "span_id", "parent_span_id", "start", "end", "attributes")


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def _requests(path: Path) -> Iterator[dict[str, Any]]:
    """Each whole ExportTraceServiceRequest line; reading stops at a line cut short by a kill or a full disk."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for line in f:
            try:
                yield json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return


def read_spans(path: Path, origin_ns: int | None) -> pd.DataFrame:
    """Flatten every span; start/end become seconds since `origin_ns` (the run's start) when given."""
    rows = []
    for req in _requests(path):
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    start_ns, end_ns = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
                    start: float = start_ns
                    end: float = end_ns
                    if origin_ns is not None:
                        start, end = (start_ns - origin_ns) / 1e9, (end_ns - origin_ns) / 1e9
                    rows.append({"name": s["name"], "trace_id": s.get("traceId"), "span_id": s.get("spanId"),
                                 "parent_span_id": s.get("parentSpanId") or None, "start": start, "end": end,
                                 "attributes": {a["key"]: _value(a["value"]) for a in s.get("attributes", [])}})
    return pd.DataFrame(rows, columns=list(SPAN_COLUMNS))
