"""Where a simulation's requests come from: a workload YAML file (a generated stream) or an engine trace
directory (the exact requests it served, with their token ids, times and configuration).

Both give `SimRequest`s in the order the simulator must add them, one at a time, so a million-request
workload never sits in memory as a list.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.request import RefusedRequest, Request
from engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from traces import Trace

DEFAULT_VOCAB_SIZE = 32000


@dataclass(slots=True, kw_only=True)
class SimRequest:
    """One request as the simulator adds it.

    `add_time` is when the scheduler sees it: the arrival for workloads; for traces the recorded
    `queued` time, which a recorded replay needs to reproduce the engine's decisions exactly.
    `output_token_ids` (traces) are fed back as the sampled tokens; `stop_at_end` says the request
    ended with a stop (EOS/stop token) after exactly those tokens rather than on its length limit.
    """

    request_id: str
    arrival: float
    prompt_token_ids: list[int] | None
    max_tokens: int | None
    add_time: float
    priority: int = 0
    output_token_ids: list[int] | None = None
    stop_at_end: bool = False
    num_prompt_tokens: int | None = None  # for a prompt too long to serve, whose ids (None) were never made
    # The prompt's block hashes by block size, shared by the copies of one request that `sim plan` adds at
    # rate after rate, rather than hashing every prompt again in every run.
    prompt_block_hashes: dict[int, list[bytes]] | None = None


@dataclass(slots=True, kw_only=True)
class Source:
    """A request stream plus what the source knows about the run: the scheduler/cache config of an
    engine trace, the workload for meta.json, and finishes that came from outside the scheduler."""

    kind: str  # "workload" or "trace"
    path: Path
    requests: Iterator[SimRequest]
    num_requests: int | None
    meta: dict[str, Any]
    scheduler: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    # step -> [(request_id, finish_reason)]: aborts and frontend stop strings, applied before that step.
    external_finishes: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    trace: Trace | None = None
    # Set before `requests` is read (the scheduler's max_model_len): a workload's longer prompts then come
    # without ids, never made, and are refused when added.
    max_prompt_tokens: int | None = None


def open_source(path: str | Path, vocab_size: int | None = None, limit: int | None = None,
                time_scale: float = 1.0, exact_times: bool = False) -> Source:
    """A trace directory or a workload file; `exact_times` adds trace requests at their queued times."""
    from workloads.workload import check_time_scale

    check_time_scale(time_scale)  # before any request is read: an infinite scale would never end a replay
    p = Path(path)
    if p.is_dir():
        return trace_source(p, limit, time_scale, exact_times)
    return workload_source(p, vocab_size or DEFAULT_VOCAB_SIZE, limit, time_scale)


def workload_source(path: Path, vocab_size: int, limit: int | None = None, time_scale: float = 1.0) -> Source:
    from workloads import load_workload

    workload = load_workload(path)
    meta = {**workload.to_dict(), "time_scale": time_scale, "max_requests": limit, "vocab_size": vocab_size}
    source = Source(kind="workload", path=path, requests=iter(()), num_requests=workload.count(limit), meta=meta)

    def stream() -> Iterator[SimRequest]:
        for r in workload.requests(vocab_size=vocab_size, limit=limit, time_scale=time_scale,
                                   max_prompt_tokens=source.max_prompt_tokens):
            yield SimRequest(request_id=r.request_id, arrival=r.arrival, prompt_token_ids=r.prompt_token_ids,
                             max_tokens=r.max_tokens, add_time=r.arrival, num_prompt_tokens=r.num_prompt_tokens)

    source.requests = stream()
    return source


def _natural(rid: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", rid))


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def trace_source(path: Path, limit: int | None = None, time_scale: float = 1.0,
                 exact_times: bool = False) -> Source:
    """The requests of an engine (or sim) trace in the order its scheduler saw them."""
    import traces

    trace = traces.load(path)
    req = trace.requests
    if not len(req):
        raise traces.TraceError(f"{path}: the trace has no requests to replay")
    cols = ["request_id", "arrival", "queued", "prompt_token_ids", "output_token_ids", "max_tokens",
            "priority", "finish_reason"]
    rows = []
    for rid, arrival, queued, prompt, output, max_tokens, priority, reason in zip(*(req[c] for c in cols)):
        arrival = float(arrival) * time_scale
        queued = _num(queued)
        add = queued * time_scale if exact_times and queued is not None else arrival
        out = [int(t) for t in output] if output is not None else []
        mt = _num(max_tokens)
        prompt = [int(t) for t in prompt] if prompt is not None else []
        rows.append(SimRequest(request_id=str(rid), arrival=arrival, prompt_token_ids=prompt,
                               max_tokens=int(mt) if mt else None, add_time=add, priority=int(_num(priority) or 0),
                               output_token_ids=out, stop_at_end=reason == "stop" and bool(out)))
    rows.sort(key=lambda r: (r.add_time, r.arrival, _natural(r.request_id)))
    if limit is not None:
        rows = rows[:limit]
    config = trace.meta.get("config", {})
    src = Source(kind="trace", path=path, requests=iter(rows), num_requests=len(rows),
                 meta={"source_trace": str(path), "time_scale": time_scale, "max_requests": limit,
                       "workload": trace.meta.get("workload")},
                 scheduler=dict(config.get("scheduler") or {}), cache=dict(config.get("cache") or {}),
                 model=dict(config.get("model") or {}),
                 external_finishes=_external_finishes(trace, {r.request_id for r in rows}), trace=trace)
    # A stop that the frontend found (stop string) is replayed as an external finish, not as a token stop.
    external = {rid for items in src.external_finishes.values() for rid, _ in items}
    for r in rows:
        if r.request_id in external:
            r.stop_at_end = False
    return src


def _external_finishes(trace: Trace, keep: set[str]) -> dict[int, list[tuple[str, str]]]:
    """Finish/abort rows of requests not scheduled in that step: ended from outside the scheduler (an
    abort, or a stop string the output processor found) between the previous step and this one."""
    d = trace.decisions
    if not len(d):
        return {}
    ends = d[d["event"].isin(["finish", "abort"])]
    if not len(ends):
        return {}
    sched = d[d["event"] == "schedule"]
    scheduled = set(zip(sched["step"].tolist(), sched["request_id"].tolist()))
    out: dict[int, list[tuple[str, str]]] = {}
    for step, rid, reason in zip(ends["step"].tolist(), ends["request_id"].tolist(), ends["finish_reason"].tolist()):
        if (step, rid) not in scheduled and rid in keep:
            out.setdefault(int(step), []).append((rid, reason if isinstance(reason, str) else "abort"))
    return out


def make_request(r: SimRequest, block_size: int | None = None) -> Request:
    """The scheduler request for a simulated one: greedy, EOS ignored unless the recorded request stopped
    on a token (then that last token is its EOS and min_tokens keeps it from stopping earlier); with `block_size`
    its block hashes exist before routing (prefix-affinity reads them, the scheduler reuses them)."""
    out = r.output_token_ids
    if r.stop_at_end and out:
        params = SamplingParams(max_tokens=r.max_tokens, min_tokens=len(out), temperature=0.0)
        eos = out[-1]
    else:
        params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
        eos = None
    if r.prompt_token_ids is None:
        if r.num_prompt_tokens is None:
            raise ValueError(f"request {r.request_id!r}: neither its prompt nor its prompt's length is known")
        return RefusedRequest(r.request_id, r.num_prompt_tokens, params, arrival_time=r.arrival)
    memo = r.prompt_block_hashes if block_size else None
    known = memo.get(block_size, ()) if memo is not None and block_size is not None else ()
    req = Request(r.request_id, r.prompt_token_ids, params, eos_token_id=eos, arrival_time=r.arrival,
                  priority=r.priority, block_size=block_size, block_hashes=known)
    if memo is not None and block_size is not None and not known:
        memo[block_size] = list(req.block_hashes)
    return req
