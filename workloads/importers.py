"""Streaming readers for public trace formats: one row at a time, so a huge trace never sits in memory."""
from __future__ import annotations

import csv
import json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from workloads.errors import WorkloadError

MOONCAKE_BLOCK_TOKENS = 512
# A JSON line of a trace that carries prompt token ids runs to a few MB; past this it is not a trace row.
MAX_LINE_CHARS = 64 << 20


@dataclass(slots=True)
class TraceRow:
    """One request of a trace: arrival in seconds since the trace's start, lengths in tokens; a trace that
    carries the real prompt also gives its token ids (`prompt_token_ids`, then `prompt_tokens` is their count)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


# Past any model's context (10M tokens at most today) and any trace's span (a few years): refused per row.
MAX_TOKENS = 1 << 24
MAX_SECONDS = 1e8


def _length(value: Any, path: Path, line: int, column: str) -> int:
    """A token count; 0 is raised to 1 (real traces have a few), anything else non-integral is an error, and so
    is a count past any model's context: it would be allocated token by token before anything could refuse it."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is not a number") from None
    if not number.is_integer() or number < 0:
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is not a token count (an integer >= 0)")
    if number > MAX_TOKENS:
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is more than any model's context "
                            f"(at most {MAX_TOKENS})")
    return max(1, int(number))


def _seconds(value: Any, path: Path, line: int, column: str) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is not a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is not a finite number")
    if abs(number) > MAX_SECONDS * (1e9 if column.endswith("_ns") else 1):
        raise WorkloadError(path, f"line {line}", f"{column} {value!r} is more than {MAX_SECONDS:g} s into the trace")
    return number


def _csv_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """(line number, the wanted columns in order) for each non-blank row; checks the header."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise WorkloadError(path, "line 1", f"header lacks column {missing[0]!r} (has {','.join(header)})")
        index = [header.index(c) for c in columns]
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) < len(header):
                raise WorkloadError(path, f"line {reader.line_num}", f"{len(row)} fields, the header has {len(header)}")
            yield reader.line_num, [row[i].strip() for i in index]


def json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON-lines file, each line read up to
    MAX_LINE_CHARS: a file that is not JSON lines (one huge line) fails on that line, not on memory."""
    with open(path, encoding="utf-8") as f:
        line_no = 0
        while line := f.readline(MAX_LINE_CHARS + 1):
            line_no += 1
            if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
                raise WorkloadError(path, f"line {line_no}", f"longer than {MAX_LINE_CHARS >> 20} MiB "
                                    "(not a JSON-lines trace?)")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(path, f"line {line_no}", f"not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise WorkloadError(path, f"line {line_no}", "expected a JSON object")
            yield line_no, row


def _field(row: dict, key: str, path: Path, line: int) -> Any:
    if key not in row:
        raise WorkloadError(path, f"line {line}", f"missing field {key!r}")
    return row[key]


def _azure(path: Path) -> Iterator[tuple[int, TraceRow]]:
    """Azure LLM inference trace 2023: `TIMESTAMP,ContextTokens,GeneratedTokens`, datetimes made relative."""
    start: datetime | None = None
    for line, (stamp, context, generated) in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            raise WorkloadError(path, f"line {line}", f"TIMESTAMP {stamp!r} is not a date and time") from None
        start = when if start is None else start
        yield line, TraceRow((when - start).total_seconds(), _length(context, path, line, "ContextTokens"),
                             _length(generated, path, line, "GeneratedTokens"))


def _mooncake(path: Path) -> Iterator[tuple[int, TraceRow]]:
    """Mooncake FAST'25 JSONL: `timestamp` in ms (made relative, in seconds), lengths and 512-token `hash_ids`."""
    start: float | None = None
    for line, row in json_lines(path):
        stamp = _seconds(_field(row, "timestamp", path, line), path, line, "timestamp")
        start = stamp if start is None else start
        hash_ids = row.get("hash_ids", [])
        if not isinstance(hash_ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hash_ids):
            raise WorkloadError(path, f"line {line}", "hash_ids must be a list of integers >= 0")
        prompt = _length(_field(row, "input_length", path, line), path, line, "input_length")
        output = _length(_field(row, "output_length", path, line), path, line, "output_length")
        yield line, TraceRow((stamp - start) / 1000.0, prompt, output, hash_ids)


def _plain_csv(path: Path) -> Iterator[tuple[int, TraceRow]]:
    """Plain CSV with `arrival` (seconds since start), `prompt_tokens`, `output_tokens`; other columns ignored."""
    for line, (arrival, prompt, output) in _csv_rows(path, ("arrival", "prompt_tokens", "output_tokens")):
        yield line, TraceRow(_seconds(arrival, path, line, "arrival"), _length(prompt, path, line, "prompt_tokens"),
                             _length(output, path, line, "output_tokens"))


def _plain_jsonl(path: Path) -> Iterator[tuple[int, TraceRow]]:
    """JSON lines with `arrival` (seconds since start), `prompt_tokens`, `output_tokens`."""
    for line, row in json_lines(path):
        arrival, prompt, output = (_field(row, k, path, line) for k in ("arrival", "prompt_tokens", "output_tokens"))
        yield line, TraceRow(_seconds(arrival, path, line, "arrival"), _length(prompt, path, line, "prompt_tokens"),
                             _length(output, path, line, "output_tokens"))


def _token_ids(value: Any, path: Path, line: int, column: str) -> list[int]:
    """A non-empty list of token ids (integers >= 0), kept as given."""
    if not isinstance(value, list) or not value:
        raise WorkloadError(path, f"line {line}", f"{column} must be a non-empty list of token ids")
    for i, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise WorkloadError(path, f"line {line}", f"{column}[{i}] {t!r} is not a token id (an integer >= 0)")
    return value


def _llmservingsim(path: Path) -> Iterator[tuple[int, TraceRow]]:
    """LLMServingSim's workload JSONL (what its vLLM runs served): `arrival_time_ns` since the start, the real
    prompt as `input_tok_ids` (its length must be `input_toks`) and `output_toks`."""
    for line, row in json_lines(path):
        arrival = _seconds(_field(row, "arrival_time_ns", path, line), path, line, "arrival_time_ns") / 1e9
        ids = _token_ids(_field(row, "input_tok_ids", path, line), path, line, "input_tok_ids")
        if "input_toks" in row and row["input_toks"] != len(ids):
            raise WorkloadError(path, f"line {line}", f"input_toks {row['input_toks']!r} is not the length of "
                                f"input_tok_ids ({len(ids)})")
        output = _length(_field(row, "output_toks", path, line), path, line, "output_toks")
        yield line, TraceRow(arrival, len(ids), output, prompt_token_ids=ids)


_READERS: dict[str, Callable[[Path], Iterator[tuple[int, TraceRow]]]] = {
    "azure": _azure, "mooncake": _mooncake, "csv": _plain_csv, "jsonl": _plain_jsonl, "llmservingsim": _llmservingsim,
}


def read_trace(path: str | Path, fmt: str) -> Generator[TraceRow, None, None]:
    """Rows of a trace in file order; arrivals must start at >= 0 and never go back (a stream cannot sort)."""
    path = Path(path)
    if fmt not in _READERS:
        raise WorkloadError(path, "format", f"unknown trace format {fmt!r} (expected one of {', '.join(_READERS)})")
    previous = 0.0
    try:
        for line, row in _READERS[fmt](path):
            if row.arrival < previous:
                raise WorkloadError(path, f"line {line}", f"arrival {row.arrival:g} s is before the previous row's "
                                    f"{previous:g} s (arrivals must be >= 0 and sorted)")
            previous = row.arrival
            yield row
    except UnicodeDecodeError:
        raise WorkloadError(path, "file", "not UTF-8 text") from None
    except OSError as e:
        raise WorkloadError(path, "file", f"cannot read it ({e.strerror})") from None
