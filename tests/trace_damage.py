"""Ways to damage a real trace directory, as a kill, a full disk or a careless edit leaves it."""
from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from traces.schema import META_FILE, TABLES, parquet_file, stream_file


def garbage(path: Path) -> None:
    path.write_bytes(b"this is not a parquet file\n" * 40)


def zero_bytes(path: Path) -> None:
    path.write_bytes(b"")


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop_column(path: Path, column: str) -> None:
    pq.write_table(pq.read_table(path).drop_columns([column]), path)


def to_streams(root: Path) -> None:
    """Turn a compacted trace back into the JSON lines of a run that never ended (as after a SIGKILL)."""
    for table in TABLES:
        src = root / parquet_file(table)
        rows = pq.read_table(src).to_pylist()
        (root / stream_file(table)).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        src.unlink()
    meta = orjson.loads((root / META_FILE).read_bytes())
    meta["complete"] = False
    (root / META_FILE).write_bytes(orjson.dumps(meta))


# name -> (damage, the file the one-line error must name)
DAMAGES = {
    "garbage steps.parquet": (lambda d: garbage(d / "steps.parquet"), "steps.parquet"),
    "0-byte requests.parquet": (lambda d: zero_bytes(d / "requests.parquet"), "requests.parquet"),
    "truncated requests.parquet": (lambda d: cut_in_half(d / "requests.parquet"), "requests.parquet"),
    "meta.json a JSON list": (lambda d: (d / META_FILE).write_text("[1, 2, 3]\n"), META_FILE),
    "meta.json not UTF-8": (lambda d: (d / META_FILE).write_bytes(b'{"format_version": 1, "x": "\xff\xfe"}'),
                            META_FILE),
    "steps without end": (lambda d: drop_column(d / "steps.parquet", "end"), "steps.parquet"),
    "requests without arrival": (lambda d: drop_column(d / "requests.parquet", "arrival"), "requests.parquet"),
}
