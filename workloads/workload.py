"""Workload: a validated workload file, its request stream, and scaled-down copies for small devices."""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workloads.errors import WorkloadError, from_validation_error
from workloads.generate import FIRST_TOKEN_ID, WorkloadRequest, stream_requests
from workloads.importers import read_trace
from workloads.spec import MAX_REQUESTS, TraceArrival, WorkloadSpec

MAX_TIME_SCALE = 1e6  # arrivals stretched past a million-fold leave float64 times past any run's span


def check_time_scale(time_scale: float) -> float:
    """--time-scale as every reader of a workload or trace takes it: a finite factor > 0 (inf or nan
    would put every arrival at an infinite or undefined time, and a run would wait for it for ever)."""
    if not (isinstance(time_scale, int | float) and math.isfinite(time_scale) and 0 < time_scale <= MAX_TIME_SCALE):
        raise ValueError(f"--time-scale: must be a finite number in (0, {MAX_TIME_SCALE:g}], got {time_scale}")
    return float(time_scale)


@dataclass(slots=True)
class Workload:
    """A workload file after validation; `trace_path` is the resolved trace file for `arrival.process: trace`."""

    spec: WorkloadSpec
    path: Path | None = None
    trace_path: Path | None = None

    @property
    def name(self) -> str:
        return self.spec.name or (self.path.stem if self.path else "workload")

    @property
    def seed(self) -> int:
        return self.spec.seed

    def count(self, limit: int | None = None) -> int | None:
        """How many requests `requests(limit=limit)` yields, where that is known without generating them
        (a progress bar's total): num_requests, or a trace's rows; None for a duration-bounded workload."""
        if self.spec.duration is not None:
            return None
        n = self.spec.num_requests
        arrival = self.spec.arrival
        if self.trace_path is not None and isinstance(arrival, TraceArrival):
            from workloads.importers import read_trace

            rows = sum(1 for _ in read_trace(self.trace_path, arrival.format))
            n = rows if n is None else min(n, rows)
        return n if limit is None or n is None else min(n, limit)

    def requests(self, vocab_size: int = 32000, limit: int | None = None, time_scale: float = 1.0,
                 max_prompt_tokens: int | None = None) -> Iterator[WorkloadRequest]:
        """A stream (generator) of requests in arrival order; arrivals are multiplied by `time_scale`. A
        prompt longer than `max_prompt_tokens` comes without its token ids, which are never made."""
        if vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"vocab_size must be > {FIRST_TOKEN_ID}, got {vocab_size}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        check_time_scale(time_scale)
        return stream_requests(self.spec, self.trace_path, vocab_size, limit, time_scale, max_prompt_tokens)

    def scaled(self, num_requests: int | None = None, length_factor: float | None = None,
               rate_factor: float | None = None) -> Workload:
        """A copy sized for a small device: fewer requests, lengths times `length_factor`, rate times `rate_factor`.

        A duration still applies alongside `num_requests`; for traces the rate factor compresses trace time.
        """
        update: dict[str, Any] = {}
        if num_requests is not None:
            if num_requests < 1:
                raise ValueError(f"num_requests must be >= 1, got {num_requests}")
            update["num_requests"] = num_requests
        if length_factor is not None:
            if not length_factor > 0:
                raise ValueError(f"length_factor must be > 0, got {length_factor}")
            update["length_scale"] = self.spec.length_scale * length_factor
        if rate_factor is not None:
            if not rate_factor > 0:
                raise ValueError(f"rate_factor must be > 0, got {rate_factor}")
            a = self.spec.arrival
            change = {"time_scale": a.time_scale / rate_factor} if isinstance(a, TraceArrival) else {
                "rate": a.rate * rate_factor}
            update["arrival"] = a.model_copy(update=change)
        return Workload(self.spec.model_copy(update=update), self.path, self.trace_path)

    def to_dict(self) -> dict:
        """The spec as plain data (for a trace's meta.json); `workload_from_dict` rebuilds the same workload."""
        d = self.spec.model_dump(mode="json", exclude_none=True)
        d["name"] = self.name
        for key in ("prompt_tokens", "output_tokens"):
            if key in d:
                d[key] = {"dist": d[key].pop("dist"), **d[key]}
        if self.trace_path is not None:
            d["arrival"]["path"] = str(self.trace_path)
        return d


def _check(spec: WorkloadSpec, source: str | Path, base_dir: Path) -> Path | None:
    """Rules that span fields; returns the resolved trace file, whose header and first row are read now."""
    arrival = spec.arrival
    if not isinstance(arrival, TraceArrival):
        for key in ("prompt_tokens", "output_tokens"):
            if getattr(spec, key) is None:
                raise WorkloadError(source, key, "is required (unless arrival.process is trace)")
        if spec.num_requests is None and spec.duration is None:
            raise WorkloadError(source, "num_requests", "give num_requests or duration (seconds)")
        if spec.num_requests is None and spec.duration is not None and arrival.rate * spec.duration > MAX_REQUESTS:
            # Only the duration ends such a stream: bound the requests it makes as num_requests is bounded.
            raise WorkloadError(source, "duration", f"{spec.duration:g} s at arrival.rate {arrival.rate:g}/s is about "
                                f"{arrival.rate * spec.duration:.3g} requests, more than {MAX_REQUESTS:,}: give "
                                "num_requests or a shorter duration")
        return None
    for key in ("prompt_tokens", "output_tokens"):
        if getattr(spec, key) is not None:
            raise WorkloadError(source, key, "not allowed with arrival.process trace (the trace gives the lengths)")
    if spec.prefix is not None and arrival.format == "mooncake":
        raise WorkloadError(source, "prefix", "not allowed with mooncake traces (their hash_ids say what is shared)")
    if spec.prefix is not None and arrival.format == "llmservingsim":
        raise WorkloadError(source, "prefix", "not allowed with llmservingsim traces (their prompts are the real "
                            "token ids, shared prefixes included)")
    trace = Path(arrival.path).expanduser()
    trace = trace if trace.is_absolute() else base_dir / trace
    if not trace.is_file():
        raise WorkloadError(source, "arrival.path", f"trace file not found: {trace}")
    rows = read_trace(trace, arrival.format)
    try:
        next(rows, None)
    finally:
        rows.close()
    return trace.resolve()


def _build(data: Any, source: str | Path, base_dir: Path, path: Path | None) -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError(source, "(top level)", f"expected a mapping of fields, got {type(data).__name__}")
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, source, data) from None
    return Workload(spec, path, _check(spec, source, base_dir))


MAX_WORKLOAD_BYTES = 4 << 20


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload YAML file; every problem becomes a one-line WorkloadError."""
    path = Path(path)
    try:
        with path.open("rb") as f:  # bounded: a workload file is small, whatever the path points at
            raw = f.read(MAX_WORKLOAD_BYTES + 1)
        if len(raw) > MAX_WORKLOAD_BYTES:
            raise WorkloadError(path, "file", f"larger than {MAX_WORKLOAD_BYTES >> 20} MiB, not a workload file "
                                "(long request lists belong in a trace file it names)")
        data = yaml.safe_load(raw.decode("utf-8"))
    except FileNotFoundError:
        raise WorkloadError(path, "file", "no such file") from None
    except UnicodeDecodeError:
        raise WorkloadError(path, "file", "not UTF-8 text") from None
    except OSError as e:
        raise WorkloadError(path, "file", f"cannot read it ({e.strerror})") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}" if mark else "yaml"
        raise WorkloadError(path, where, f"bad YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise WorkloadError(path, "yaml", f"bad YAML: {e}") from None
    return _build(data, path, path.parent, path)


def workload_from_dict(d: dict, source: str = "<dict>", base_dir: str | Path | None = None) -> Workload:
    """Validate a workload given as data; a relative trace path resolves against `base_dir` (default: cwd)."""
    return _build(d, source, Path(base_dir) if base_dir is not None else Path.cwd(), None)
