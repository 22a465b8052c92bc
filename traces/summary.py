"""Headline metrics of a run from its requests (and steps) tables; shared by `engine run` and `sim`."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.metrics import LATENCIES, finished, percentile, prefix_hit_rate, request_latencies

# The columns `summarize` reads (see `trace_summary`).
SUMMARY_COLUMNS = {
    "requests": ("request_id", "arrival", "first_scheduled", "first_token", "finish", "num_prompt_tokens",
                 "num_output_tokens", "num_cached_tokens", "num_preemptions", "finish_reason", "error"),
    "steps": ("step", "num_prefill_tokens", "kv_blocks_used", "kv_blocks_total", "prefix_hit_tokens"),
}

# The headline figures an interval or an error breakdown is given for: each latency's p50/p90/p99 and the
# output throughput.
HEADLINE_METRICS = tuple(f"{m}_p{q}_s" for m in LATENCIES for q in (50, 90, 99)) + ("output_throughput_tok_s",)


# Admission errors carry each request's own numbers; these rewrite them to one reason per cause.
_REASONS = (
    (re.compile(r"(?:more|longer) than max_model_len=(\d+)"), "prompt longer than max_model_len={0}"),
    # vLLM 0.32's input processor (a trace recorded from real vLLM), both the > and the == case.
    (re.compile(r"prompt \(length \d+\) (?:plus the .*? )?is longer than the maximum model length of (\d+)"),
     "prompt longer than max_model_len={0}"),
    (re.compile(r"needs \d+ KV blocks of (\d+) tokens but the cache has (\d+)"),
     "prompt + max_tokens need more KV blocks than the cache has ({1} blocks of {0} tokens)"),
)


def rejection_reason(error: str) -> str:
    for pattern, label in _REASONS:
        m = pattern.search(error)
        if m:
            return label.format(*m.groups())
    return error


def rejections(requests: pd.DataFrame) -> dict[str, int]:
    """Requests refused at admission (an error and never scheduled), counted by reason, most first."""
    if "error" not in requests.columns or not len(requests):
        return {}
    refused = requests["error"].notna() & requests["first_scheduled"].isna()
    counts = requests.loc[refused, "error"].astype(str).map(rejection_reason).value_counts()
    return {str(k): int(v) for k, v in counts.items()}


def format_rejections(counts: dict[str, int]) -> list[str]:
    """`402 rejected: prompt longer than max_model_len=4096`, one line per reason."""
    return [f"{n} rejected: {reason}" for reason, n in counts.items()]


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | None = None,
              percentiles: tuple[int, ...] = (50, 90, 99)) -> dict[str, Any]:
    lat = request_latencies(requests)
    done = finished(requests)
    start = float(requests["arrival"].min()) if len(requests) else 0.0
    end = float(done["finish"].max()) if len(done) else start
    duration = max(end - start, 1e-9)
    out_tokens = int(done["num_output_tokens"].sum())
    s: dict[str, Any] = {
        "requests": int(len(requests)), "finished": int(len(done)),
        "errors": int((requests["finish_reason"] == "error").sum()),
        "aborted": int((requests["finish_reason"] == "abort").sum()),
        "duration_s": duration, "output_tokens": out_tokens,
        "output_throughput_tok_s": out_tokens / duration, "request_throughput_req_s": len(done) / duration,
        "rejected": rejections(requests),
        "preemptions": int(requests["num_preemptions"].sum()),
        "prefix_hit_rate": prefix_hit_rate(requests, steps),
    }
    for name in LATENCIES:
        values = lat[name].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        s[f"{name}_mean_s"] = float(values.mean()) if values.size else math.nan
        for q in percentiles:
            s[f"{name}_p{q}_s"] = percentile(values, q)
    if steps is not None and len(steps):
        s["steps"] = int(len(steps))
        s["kv_usage_mean"] = float((steps["kv_blocks_used"] / steps["kv_blocks_total"]).mean())
        s["kv_usage_max"] = float((steps["kv_blocks_used"] / steps["kv_blocks_total"]).max())
    return s


def format_summary(s: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = s.get(key, math.nan)
        return "n/a" if v != v else f"{v * 1e3:.1f} ms"

    lines = [
        f"requests: {s['finished']} finished of {s['requests']} ({s['errors']} errors, {s['aborted']} aborted)",
        *format_rejections(s.get("rejected", {})),
        f"duration: {s['duration_s']:.2f} s",
        f"output throughput: {s['output_throughput_tok_s']:.1f} tok/s ({s['output_tokens']} tokens)",
        f"ttft: p50 {ms('ttft_p50_s')}, p99 {ms('ttft_p99_s')}",
        f"tpot: p50 {ms('tpot_p50_s')}, p99 {ms('tpot_p99_s')}",
        f"e2e: p50 {ms('e2e_p50_s')}, p99 {ms('e2e_p99_s')}",
        f"preemptions: {s['preemptions']}",
        f"prefix hit rate: {s['prefix_hit_rate'] * 100:.1f}% of the tokens admissions needed (re-admissions "
        "included)",
    ]
    if "steps" in s:
        lines.append(f"steps: {s['steps']}, KV usage mean {s['kv_usage_mean'] * 100:.1f}%, "
                     f"max {s['kv_usage_max'] * 100:.1f}%")
    return "\n".join(lines)


def trace_summary(path: str | Path) -> str:
    """The console summary of a trace directory, read from the summary's columns only: a long run's
    decisions and block events, most of its trace, are never loaded."""
    from traces.reader import load

    t = load(path, columns=SUMMARY_COLUMNS, tables=SUMMARY_COLUMNS)
    return format_summary(summarize(t.requests, t.steps))
