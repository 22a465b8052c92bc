"""Small files read with a cap on what is read, whatever the path claims to be: a special file such as
/dev/zero reports size 0 and never ends, so the cap is on the bytes read, not on `stat`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The whole file, or a one-line ValueError naming it: missing, unreadable, or past `limit` bytes."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file ({what})") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > limit:
        raise ValueError(f"{path}: more than {limit:,} bytes, too large for a {what}")
    return data


def read_mapping(path: Path, limit: int, what: str, fmt: str = "json") -> dict[str, Any]:
    """A JSON or YAML (safe_load) file that must hold one object; one-line ValueError naming the file."""
    data = read_bounded(path, limit, what)
    try:
        doc = yaml.safe_load(data.decode("utf-8")) if fmt == "yaml" else json.loads(data)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a {what} must be a mapping of fields, not a {type(doc).__name__}")
    return doc
