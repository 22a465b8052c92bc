"""Headline metrics of a run from its requests (and steps) tables; shared by `engine run` and `sim`."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

# The columns `summarize` reads: `traces.load(path, columns=SUMMARY_COLUMNS, tables=SUMMARY_COLUMNS)`.
SUMMARY_COLUMNS = {
    "requests": ("request_id", "arrival", "first_scheduled", "first_token", "finish", "num_prompt_tokens",
                 "num_output_tokens", "num_cached_tokens", "num_preemptions", "finish_reason"),
    "steps": ("step", "kv_blocks_used", "kv_blocks_total"),
}


def _pct(values: pd.Series | np.ndarray, q: float) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


def request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per finished request: ttft, tpot (mean time per output token after the first), e2e, queue."""
    done = requests[requests["finish_reason"].isin(["stop", "length"])]
    out = pd.DataFrame({"request_id": done["request_id"]})
    out["ttft"] = done["first_token"] - done["arrival"]
    out["e2e"] = done["finish"] - done["arrival"]
    out["queue"] = done["first_scheduled"] - done["arrival"]
    n = done["num_output_tokens"]
    out["tpot"] = np.where(n > 1, (done["finish"] - done["first_token"]) / (n - 1).clip(lower=1), np.nan)
    return out.reset_index(drop=True)


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | None = None,
              percentiles: tuple[int, ...] = (50, 90, 99)) -> dict[str, Any]:
    lat = request_latencies(requests)
    done = requests[requests["finish_reason"].isin(["stop", "length"])]
    start = float(requests["arrival"].min()) if len(requests) else 0.0
    end = float(done["finish"].max()) if len(done) else start
    duration = max(end - start, 1e-9)
    out_tokens = int(done["num_output_tokens"].sum())
    prompt_tokens = int(done["num_prompt_tokens"].sum())
    s: dict[str, Any] = {
        "requests": int(len(requests)), "finished": int(len(done)),
        "errors": int((requests["finish_reason"] == "error").sum()),
        "aborted": int((requests["finish_reason"] == "abort").sum()),
        "duration_s": duration, "output_tokens": out_tokens,
        "output_throughput_tok_s": out_tokens / duration, "request_throughput_req_s": len(done) / duration,
        "preemptions": int(requests["num_preemptions"].sum()),
        "prefix_hit_rate": float(done["num_cached_tokens"].sum()) / prompt_tokens if prompt_tokens else 0.0,
    }
    for name in ("ttft", "tpot", "e2e"):
        for q in percentiles:
            s[f"{name}_p{q}_s"] = _pct(lat[name], q)
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
        f"duration: {s['duration_s']:.2f} s",
        f"output throughput: {s['output_throughput_tok_s']:.1f} tok/s ({s['output_tokens']} tokens)",
        f"ttft: p50 {ms('ttft_p50_s')}, p99 {ms('ttft_p99_s')}",
        f"tpot: p50 {ms('tpot_p50_s')}, p99 {ms('tpot_p99_s')}",
        f"e2e: p50 {ms('e2e_p50_s')}, p99 {ms('e2e_p99_s')}",
        f"preemptions: {s['preemptions']}",
        f"prefix hit rate: {s['prefix_hit_rate'] * 100:.1f}% of prompt tokens",
    ]
    if "steps" in s:
        lines.append(f"steps: {s['steps']}, KV usage mean {s['kv_usage_mean'] * 100:.1f}%, "
                     f"max {s['kv_usage_max'] * 100:.1f}%")
    return "\n".join(lines)
