"""A trace's meta.json read and checked, without pandas: whether a directory holds a trace is asked
before any command does its work (and refuses an existing trace at once)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traces.errors import TraceError
from traces.schema import FORMAT_VERSION, META_FILE

MAX_META_BYTES = 64 << 20  # a meta.json holds configs and a workload's description, never rows


def read_meta(root: Path) -> dict[str, Any]:
    """meta.json as a dict of this format version, or a one-line TraceError."""
    meta_path = root / META_FILE
    if not root.is_dir():
        raise TraceError(f"{root}: not a directory")
    if not meta_path.is_file():
        raise TraceError(f"{root}: not a trace directory (no {META_FILE})")
    try:
        with open(meta_path, "rb") as f:
            data = f.read(MAX_META_BYTES + 1)
        if len(data) > MAX_META_BYTES:
            raise TraceError(f"{meta_path}: more than {MAX_META_BYTES:,} bytes, too large for a trace's meta")
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{meta_path}: not UTF-8 (byte {e.start})") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{meta_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{meta_path}: not a JSON object (a JSON {type(meta).__name__})")
    config = meta.get("config")
    if config is not None and not isinstance(config, dict):
        raise TraceError(f"{meta_path}: config must be a JSON object, got a JSON {type(config).__name__}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceError(f"{meta_path}: format_version is {version!r}, this stepscope reads {FORMAT_VERSION}")
    return meta
