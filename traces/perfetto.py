"""Trace directories as Chrome Trace Event Format JSON, to open in ui.perfetto.dev or chrome://tracing.

Layout, per trace (one process each, `pid` = position + 1, named "<directory> (<source>)"):
- thread "steps": every step as a complete slice, with its schedule/execute/sample phases nested in it
  (laid end to end from the step's start, from the durations in the steps table; a missing duration
  ends the chain, a zero one is skipped). Under async scheduling a step is scheduled while the one
  before it still runs, so their spans overlap: such a step goes to thread "steps (overlapping)";
- threads "prefill", "decode", "mixed": each step again, on the track of its batch's composition
  (prefill tokens only, decode tokens only, or both; steps that scheduled nothing appear only on "steps";
  a slice starts no earlier than the previous one on its track ended);
- thread "preemptions": an instant per preemption, at the start of the step that preempted;
- thread "startup": the engine's start-up spans ("Prepare model" and its children), when recorded;
- counters: KV cache blocks (used, total) and usage %, queue (running, waiting), tokens scheduled
  (prefill, decode) — each as recorded for its step, sampled at the step's start;
- async slices (cat "request"), one per request from arrival to finish, with "queued", "prefill" and
  "decode" nested in it. A request that never finished ends at its last known time: the latest of its
  own timestamps and the end of the last step that scheduled or preempted it. They pair by a
  process-local id (`id2: {"local": request_id}`): Perfetto files async slices with a plain `id` on
  global tracks, away from their process. All are named "request" (the id is in args) so Perfetto
  packs them into one group of reusable lanes rather than one track per request.
Times are microseconds since the run's start, snapped to whole nanoseconds so that nesting is exact.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from traces.outputs import replaced_when_done
from traces.reader import Trace, load

STEPS_TID, PREFILL_TID, DECODE_TID, MIXED_TID, PREEMPT_TID, STARTUP_TID, OVERLAP_TID = 1, 2, 3, 4, 5, 6, 7
THREADS = {STEPS_TID: "steps", PREFILL_TID: "prefill", DECODE_TID: "decode", MIXED_TID: "mixed",
           PREEMPT_TID: "preemptions", STARTUP_TID: "startup", OVERLAP_TID: "steps (overlapping)"}
PHASES = (("schedule", "schedule_time"), ("execute", "execute_time"), ("sample", "sample_time"))
STEP_ARGS = {"tokens": "num_scheduled_tokens", "prefill_tokens": "num_prefill_tokens",
             "decode_tokens": "num_decode_tokens", "running": "num_running", "waiting": "num_waiting",
             "preempted": "num_preempted", "kv_blocks_used": "kv_blocks_used", "new_reqs": "num_new_reqs",
             "finished": "num_finished", "prefix_hit_tokens": "prefix_hit_tokens"}
REQUEST_ARGS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "num_preemptions",
                "finish_reason", "priority", "max_tokens", "error")


def _value(v: Any) -> Any:
    """A JSON-safe scalar, or None for a missing one (NaN, NA, None): those never reach the output."""
    if v is None or isinstance(v, (list, tuple, dict)):
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _args(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v for k, v in ((k, _value(v)) for k, v in pairs) if v is not None}


def _ns(seconds: Any) -> int | None:
    v = _value(seconds)
    return None if v is None else int(round(float(v) * 1e9))


def _us(ns: int) -> float:
    return ns / 1000


def _slice(pid: int, tid: int, name: str, start_ns: int, end_ns: int, args: dict[str, Any] | None = None,
           cat: str = "step") -> dict[str, Any]:
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": _us(start_ns),
          "dur": _us(max(end_ns - start_ns, 0))}
    if args:
        ev["args"] = args
    return ev


def _metadata(pid: int, trace: Trace) -> list[dict[str, Any]]:
    events = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
               "args": {"name": f"{trace.path.name} ({trace.source})"}},
              {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}}]
    for tid, name in THREADS.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return events


def _composition_tid(prefill: int, decode: int) -> int | None:
    if prefill and decode:
        return MIXED_TID
    if prefill:
        return PREFILL_TID
    return DECODE_TID if decode else None


def _counter(pid: int, name: str, ts_ns: int, values: dict[str, Any]) -> dict[str, Any] | None:
    args = _args(values.items())
    return {"ph": "C", "pid": pid, "tid": STEPS_TID, "name": name, "ts": _us(ts_ns), "args": args} if args else None


def _records(df: pd.DataFrame, rows: int = 1 << 15) -> Iterator[dict[str, Any]]:
    """The frame's rows as dicts, a slice at a time: a million-row table never becomes a million dicts."""
    for lo in range(0, len(df), rows):
        yield from df.iloc[lo:lo + rows].to_dict("records")


def _step_events(pid: int, steps: pd.DataFrame) -> Iterator[dict[str, Any]]:
    starts = steps["start"].tolist() if len(steps) else []
    track_end: dict[int, int] = {}
    for i, row in enumerate(_records(steps)):
        start, end = _ns(row.get("start")), _ns(row.get("end"))
        if start is None or end is None:
            continue
        end = max(end, start)
        name = f"step {int(row['step'])}"
        args = _args((k, row.get(col)) for k, col in STEP_ARGS.items())
        lane = STEPS_TID if start >= track_end.get(STEPS_TID, start) else OVERLAP_TID
        track_end[lane] = end
        yield _slice(pid, lane, name, start, end, args)
        t = start
        for phase, col in PHASES:
            dur = _ns(row.get(col))
            if dur is None:  # the later phases' places are unknown too
                break
            if dur <= 0 or t >= end:
                continue
            yield _slice(pid, lane, phase, t, min(t + dur, end), cat="phase")
            t = min(t + dur, end)
        tid = _composition_tid(args.get("prefill_tokens", 0), args.get("decode_tokens", 0))
        if tid is not None:
            yield _slice(pid, tid, name, max(start, track_end.get(tid, start)), end, args)
            track_end[tid] = end
        used, total = _value(row.get("kv_blocks_used")), _value(row.get("kv_blocks_total"))
        pct = 100.0 * used / total if used is not None and total else None
        yield from (c for c in (
            _counter(pid, "KV cache blocks", start, {"used": used, "total": total}),
            _counter(pid, "KV cache usage %", start, {"percent": pct}),
            _counter(pid, "queue", start, {"running": row.get("num_running"), "waiting": row.get("num_waiting")}),
            _counter(pid, "tokens scheduled", start, {"prefill": row.get("num_prefill_tokens"),
                                                      "decode": row.get("num_decode_tokens")}),
        ) if c is not None)
        nxt = _ns(starts[i + 1]) if i + 1 < len(starts) else None
        if nxt is None or nxt > end:  # the batch is empty between steps
            if (empty := _counter(pid, "tokens scheduled", end, {"prefill": 0, "decode": 0})) is not None:
                yield empty


def _last_seen(trace: Trace) -> dict[str, int]:
    """End of the last step each request took part in (ns), for requests that never finished."""
    d, s = trace.decisions, trace.steps
    if not len(d) or not len(s):
        return {}
    ends = s.set_index("step")["end"]
    last = d.groupby("request_id")["step"].max()
    return {rid: ns for rid, step in last.items() if step in ends.index and (ns := _ns(ends[step])) is not None}


def _request_events(pid: int, trace: Trace) -> Iterator[dict[str, Any]]:
    last_seen = _last_seen(trace)
    for row in _records(trace.requests):
        rid = str(row["request_id"])
        arrival = _ns(row.get("arrival"))
        if arrival is None:
            continue
        marks = [_ns(row.get(k)) for k in ("first_scheduled", "first_token", "finish")]
        end = marks[2]
        if end is None:
            known = [m for m in (arrival, *marks[:2], _ns(row.get("queued")), last_seen.get(rid)) if m is not None]
            end = max(known)
        end = max(end, arrival)
        base = {"pid": pid, "tid": STEPS_TID, "cat": "request", "id2": {"local": rid}}
        args = _args([("request_id", rid), *((k, row.get(k)) for k in REQUEST_ARGS)])
        yield {**base, "ph": "b", "name": "request", "ts": _us(arrival), "args": args}
        bounds, prev = [arrival, *marks[:2], end], arrival
        for name, lo, hi in zip(("queued", "prefill", "decode"), bounds, bounds[1:]):
            if lo is None:
                break
            lo = min(max(lo, prev), end)
            hi = end if hi is None else min(max(hi, lo), end)
            prev = hi
            yield {**base, "ph": "b", "name": name, "ts": _us(lo)}
            yield {**base, "ph": "e", "name": name, "ts": _us(hi)}
            if hi == end:
                break
        yield {**base, "ph": "e", "name": "request", "ts": _us(end)}


def _preemption_events(pid: int, trace: Trace) -> Iterator[dict[str, Any]]:
    d = trace.decisions
    if not len(d) or not len(trace.steps):
        return
    starts = trace.steps.set_index("step")["start"]
    for row in _records(d[d["event"] == "preempt"]):
        ts = _ns(starts.get(row["step"]))
        if ts is None:
            continue
        freed = row.get("blocks_freed")
        args = _args([("request_id", str(row["request_id"])), ("step", row["step"]),
                      ("blocks_freed", len(freed) if freed is not None else None)])
        yield {"ph": "i", "s": "t", "pid": pid, "tid": PREEMPT_TID, "cat": "scheduler",
               "name": f"preempt {row['request_id']}", "ts": _us(ts), "args": args}


def _startup_events(pid: int, trace: Trace) -> list[dict[str, Any]]:
    """The "Prepare model" span tree, nested by time on one thread (span times share the steps' origin)."""
    if trace.meta.get("clock_origin_unix_ns") is None:
        return []
    spans = trace.spans
    if not len(spans):
        return []
    rows = spans.to_dict("records")
    children: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        if _value(r.get("parent_span_id")) is not None:
            children.setdefault(r["parent_span_id"], []).append(r)
    events: list[dict[str, Any]] = []

    def emit(span: dict[str, Any], lo: int, hi: int) -> None:
        start, end = _ns(span.get("start")), _ns(span.get("end"))
        if start is None or end is None:
            return
        start, end = min(max(start, lo), hi), min(max(end, start), hi)
        events.append(_slice(pid, STARTUP_TID, str(span["name"]), start, end,
                             _args((span.get("attributes") or {}).items()), cat="startup"))
        for child in sorted(children.get(span["span_id"], []), key=lambda c: c["start"]):
            emit(child, start, end)

    for root in rows:
        if root["name"] == "Prepare model" and _value(root.get("parent_span_id")) is None:
            emit(root, -(1 << 62), 1 << 62)
    return events


def _trace_events(pid: int, trace: Trace) -> Iterator[dict[str, Any]]:
    yield from _metadata(pid, trace)
    yield from _startup_events(pid, trace)
    yield from _step_events(pid, trace.steps)
    yield from _preemption_events(pid, trace)
    yield from _request_events(pid, trace)


def to_perfetto(traces: Iterable[Trace]) -> dict[str, Any]:
    """The Chrome Trace Event Format object for `traces`, shown side by side as processes 1, 2, ..."""
    events = [ev for pid, trace in enumerate(traces, 1) for ev in _trace_events(pid, trace)]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# What the export reads of a trace: no token ids, no block tables.
EXPORT_TABLES = ("steps", "requests", "decisions")
EXPORT_COLUMNS = {"requests": ("request_id", "arrival", "queued", "first_scheduled", "first_token", "finish",
                               *REQUEST_ARGS),
                  "decisions": ("step", "request_id", "event", "blocks_freed")}
WRITE_EVENTS = 1 << 13  # events serialised per write


def export_perfetto(trace_dirs: list[str | Path], out: str | Path) -> int:
    """Write the combined trace JSON of the trace directories to `out`; returns the number of events.
    One trace is read at a time, just the columns the events need, and the events are written as they
    are made, so memory holds a trace's tables, not its events. `out` appears only when complete.
    Raises traces.TraceError for a directory that is not a trace, OSError when `out` cannot be written."""
    n = 0
    with replaced_when_done(Path(out), "-o") as tmp, open(tmp, "wb") as f:
        f.write(b'{"displayTimeUnit":"ms","traceEvents":[')
        for pid, path in enumerate(trace_dirs, 1):
            trace = load(path, columns=EXPORT_COLUMNS, tables=EXPORT_TABLES)
            batch: list[bytes] = []
            for ev in _trace_events(pid, trace):
                batch.append(orjson.dumps(ev))
                if len(batch) == WRITE_EVENTS:
                    f.write((b"," if n else b"") + b",".join(batch))
                    n, batch = n + len(batch), []
            if batch:
                f.write((b"," if n else b"") + b",".join(batch))
                n += len(batch)
            del trace
        f.write(b"]}")
    return n
