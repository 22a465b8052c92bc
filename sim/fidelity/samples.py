"""`sim replay --samples N`: the same replay N times, each with its own seeded draw of the measured
residuals, so every metric comes with the spread that the machine's own step-time scatter implies.

A single deterministic replay says what the expected step times give; how far a real run lands from it
depends on runs of slow steps (queues build behind them), which only a sampled replay shows. So the
interval is the prediction: the replay's trace keeps it in its meta (`prediction`), and `sim compare`
says which of a measured run's metrics fall inside it.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.report.summary import metric_label
from traces.summary import HEADLINE_METRICS, SUMMARY_COLUMNS, summarize

if TYPE_CHECKING:
    from sim.report.summary import SLO


def interval(values: list[float]) -> dict[str, float]:
    """median, p5 and p95 of the finite values (NaN when there are none)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if not v.size:
        return {"median": math.nan, "p5": math.nan, "p95": math.nan}
    return {"median": float(np.median(v)), "p5": float(np.percentile(v, 5)), "p95": float(np.percentile(v, 95))}


def sample_replays(n: int, run: Callable[[int, str], Any], slos: list[SLO] | None = None) -> dict[str, Any]:
    """Run `run(seed, trace_dir)` for seeds 0..n-1 and summarise each metric as median [p5-p95]."""
    import traces

    per_metric: dict[str, list[float]] = {m: [] for m in HEADLINE_METRICS}
    for seed in range(n):
        with tempfile.TemporaryDirectory(prefix="stepscope-sample-") as d:
            run(seed, d)
            t = traces.load(d, columns=SUMMARY_COLUMNS, tables=SUMMARY_COLUMNS)  # not the decisions
            s = summarize(t.requests, t.steps)
        for m in HEADLINE_METRICS:
            per_metric[m].append(s.get(m, math.nan))
    return {"num_samples": n, "metrics": {m: {**interval(v), "values": v} for m, v in per_metric.items()}}


def prediction_meta(samples: dict[str, Any]) -> dict[str, Any]:
    """The interval as a trace's meta keeps it (`prediction`), for `sim compare` to score a measured run
    against: per metric p5, p50 and p95 (None where no replay had a value)."""
    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"num_samples": samples["num_samples"], "interval": "p5-p95",
            "metrics": {m: {"p5": num(r["p5"]), "p50": num(r["median"]), "p95": num(r["p95"])}
                        for m, r in samples["metrics"].items()}}


def point_replay_label(residual_seed: int | None) -> str:
    """What the single replay printed before the interval is: not the prediction."""
    if residual_seed is None:
        return "unperturbed replay (expected step times, no residuals drawn; not the prediction, which follows):"
    return f"one replay with residuals drawn (seed {residual_seed}; not the prediction, which follows):"


def format_samples(samples: dict[str, Any]) -> str:
    n = samples["num_samples"]
    lines = [f"prediction (90% interval over {n} seeded replay{'s' if n > 1 else ''} with measured residuals): "
             "median [p5-p95]"]
    for m, r in samples["metrics"].items():
        label, scale, unit = metric_label(m)
        lines.append(f"  {label:<22} {r['median'] * scale:10.2f} {unit} [{r['p5'] * scale:.2f}-{r['p95'] * scale:.2f}]")
    return "\n".join(lines)
