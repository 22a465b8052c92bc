"""One definition of each request metric and one SLO evaluator, for every place that prints or decides
on them (replay and trace summaries, the planner, compare, the TUI, benchmarks).

Metrics, per request that finished (`stop` or `length`), in seconds:
  queue = first_scheduled - arrival; ttft = first_token - arrival; e2e = finish - arrival;
  tpot = (finish - first_token) / (num_output_tokens - 1), undefined (NaN) with one output token;
  itl = the time between consecutive tokens of one request (each token's step end).
Percentiles are numpy's linear interpolation over the defined values.

SLO policy for requests that did not finish (refused, aborted, or still in flight when the measurement
ended): they are in the population and miss every SLO, as if infinitely late, so a run cannot meet an
SLO by failing the requests that would have missed it. A one-token request meets any TPOT target.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

METRICS = ("ttft", "tpot", "e2e", "queue")
LATENCIES = ("ttft", "tpot", "e2e")  # what every summary reports
FINISHED = ("stop", "length")
UNFINISHED_POLICY = "unfinished requests (refused, aborted, still in flight) count as missing every SLO"
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_LATE = 1e18  # an unfinished request's latency in a percentile: later than any threshold


def latency(metric: str, arrival: Any, first_scheduled: Any, first_token: Any, finish: Any,
            num_output_tokens: Any) -> Any:
    """`metric` of one request or, given arrays, of many (the same arithmetic on numpy values)."""
    if metric == "ttft":
        return first_token - arrival
    if metric == "e2e":
        return finish - arrival
    if metric == "queue":
        return first_scheduled - arrival
    if metric == "tpot":
        n = np.asarray(num_output_tokens, dtype=float)
        return np.where(n > 1, (finish - first_token) / np.maximum(n - 1, 1), np.nan)
    raise ValueError(f"unknown metric {metric!r} (expected one of {', '.join(METRICS)})")


def finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["finish_reason"].isin(FINISHED)]


def request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per finished request: request_id and each metric."""
    done = finished(requests)
    cols = {k: done[k].to_numpy(dtype=float) for k in ("arrival", "first_scheduled", "first_token", "finish",
                                                       "num_output_tokens")}
    out = pd.DataFrame({"request_id": done["request_id"].to_numpy()})
    for m in METRICS:
        out[m] = latency(m, **cols)
    return out


def inter_token_latencies(codes: np.ndarray, times: np.ndarray) -> np.ndarray:
    """ITL: the time between consecutive tokens of one request, from each token's request code and output
    time in order (a request's tokens adjacent); the first token of each request has none."""
    if len(codes) < 2:
        return np.empty(0)
    return np.diff(times)[codes[1:] == codes[:-1]]


def prefix_hit_rate(requests: pd.DataFrame, steps: pd.DataFrame | None = None) -> float:
    """Share of the prompt-side tokens of every admission (re-admissions after a preemption included) that
    came from the prefix cache: hits / (hits + prefill tokens computed), from the steps table, as its
    `prefix_hit_tokens` column counts them. A run without steps (an imported vLLM run) has only vLLM's
    per-request figure, taken at each request's first admission."""
    if steps is not None and len(steps) and {"prefix_hit_tokens", "num_prefill_tokens"} <= set(steps.columns):
        hits = float(pd.to_numeric(steps["prefix_hit_tokens"], errors="coerce").fillna(0).sum())
        computed = float(pd.to_numeric(steps["num_prefill_tokens"], errors="coerce").fillna(0).sum())
        return hits / (hits + computed) if hits + computed else 0.0
    done = finished(requests)
    prompt = float(done["num_prompt_tokens"].sum())
    return float(done["num_cached_tokens"].clip(lower=0).sum()) / prompt if prompt else 0.0


def percentile(values: Any, q: float) -> float:
    """The q-th percentile of the defined values (NaN dropped); NaN when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


@dataclass(frozen=True, slots=True)
class SLO:
    """`ttft_p99=2s`: a request meets it when its own ttft is <= 2 s; a run meets it when the 99th
    percentile over its population does (no percentile: every request must)."""

    metric: str
    percentile: float | None
    threshold_s: float

    @property
    def label(self) -> str:
        p = f"_p{self.percentile:g}" if self.percentile is not None else ""
        return f"{self.metric}{p}<={self.threshold_s * 1e3:g}ms"


def parse_slo(text: str) -> list[SLO]:
    """`ttft_p99=2s,tpot_p99=80ms` (units s, ms, us; bare numbers are seconds) -> SLOs; ValueError naming the part."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"([a-z]+)(?:_p(\d+(?:\.\d+)?))?=(\d+(?:\.\d*)?|\.\d+)(s|ms|us)?", part)
        if m is None:
            raise ValueError(f"--slo: {part!r} is not METRIC[_pNN]=VALUE[s|ms|us] (e.g. ttft_p99=2s)")
        metric, pct, value, unit = m.groups()
        if metric not in METRICS:
            raise ValueError(f"--slo: unknown metric {metric!r} in {part!r} (expected one of {', '.join(METRICS)})")
        if pct is not None and not 0 < float(pct) <= 100:
            raise ValueError(f"--slo: percentile in {part!r} must be in (0, 100]")
        out.append(SLO(metric, float(pct) if pct is not None else None, float(value) * _UNITS[unit or "s"]))
    if not out:
        raise ValueError("--slo: no SLO given (e.g. ttft_p99=2s,tpot_p99=80ms)")
    return out


@dataclass(frozen=True, slots=True)
class SLOResult:
    slo: SLO
    measured_s: float  # the percentile over the population (inf: it falls among the unfinished)
    met_by_requests: float  # share of the population whose own value meets it
    met: bool


@dataclass(frozen=True, slots=True)
class SLOVerdict:
    """The SLOs over a population of requests, under UNFINISHED_POLICY."""

    results: tuple[SLOResult, ...]
    population: int
    finished: int
    attainment: float  # share of the population meeting every SLO

    @property
    def met(self) -> bool:
        return all(r.met for r in self.results)

    @property
    def goodput_requests(self) -> int:
        return round(self.attainment * self.population)


def evaluate_slos(requests: pd.DataFrame, slos: list[SLO], population: int | None = None) -> SLOVerdict:
    """The SLOs over `requests` (every row is in the population) plus `population - len(requests)` more
    that never reached the table (a run stopped early): the one evaluator replay, plan and compare use."""
    lat = request_latencies(requests)
    total = max(population or 0, len(requests))
    missing = total - len(lat)
    ok = np.ones(len(lat), dtype=bool)
    results = []
    for slo in slos:
        v = lat[slo.metric].to_numpy(dtype=float)
        meets = np.where(np.isnan(v), slo.metric == "tpot", v <= slo.threshold_s)
        ok &= meets
        defined = v[~np.isnan(v)]
        padded = np.concatenate([defined, np.full(missing, _LATE)])
        q = slo.percentile if slo.percentile is not None else 100
        measured = float(np.percentile(padded, q)) if len(padded) else math.nan
        if missing and (not len(defined) or measured > defined.max()):
            measured = math.inf  # it reaches into the unfinished: later than anything measured
        results.append(SLOResult(slo, measured, float(meets.sum()) / total if total else math.nan,
                                 bool(total) and measured <= slo.threshold_s))
    return SLOVerdict(tuple(results), total, len(lat), float(ok.sum()) / total if total else math.nan)
