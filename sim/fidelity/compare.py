"""`sim compare A B`: how faithfully trace B (typically a simulator replay) reproduces trace A.

Decisions are compared step by step (traces.diff: the one definition of a divergent step, which the TUI
uses too), by index and once aligned around steps one trace lacks; the first step that differs is
explained request by request. Latency and throughput metrics are compared as relative errors, step times as MAPE over
steps aligned by index and over the steps that made identical decisions (the cost model's own error,
free of what different batches cost), and device time as B / A on decode steps of the same shape (for
two engine runs: how much the machine's speed changed between them; sim.fidelity.speed_shift). Where B
is a replay made with `--samples`, its meta holds the predicted interval, and each of A's metrics is
scored inside it or not (`interval_coverage`).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.fidelity.attribution import attribute, format_attribution
from sim.report.summary import metric_label
from sim.fidelity.speed_shift import same_shape_speed
from traces.describe import config_differences
from traces.diff import aligned_pairs, explain_step, index_pairs, matching_steps
from traces.metrics import LATENCIES
from traces.summary import summarize

if TYPE_CHECKING:
    from traces import Trace

METRICS = tuple(f"{m}_{s}_s" for m in LATENCIES for s in ("mean", "p50", "p90", "p99")) + (
    "output_throughput_tok_s", "request_throughput_req_s", "duration_s")


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a != a or b != b or a == 0:
        return None
    return (b - a) / abs(a)


def compare_traces(a: Trace, b: Trace) -> dict[str, Any]:
    """The fidelity report of trace `b` against reference trace `a` (both `traces.Trace`). A trace with
    requests but no steps (a measured run brought in by `sim import-run`) has only its request metrics
    compared; `step_level_skipped` says why the rest is absent."""
    na, nb = len(a.steps), len(b.steps)
    if not na or not nb:
        return _requests_only(a, b)
    same, da, db = matching_steps(a.decisions, na, b.decisions, nb)
    n = len(same)
    matched = int(same[:n].sum())
    first = int(np.flatnonzero(~same)[0]) if n and not same.all() else None
    metrics = _metrics(a, b)
    k = min(na, nb)
    ta = _durations(a.steps)
    tb = _durations(b.steps)
    mape = _mape(ta[:k], tb[:k])
    pairs = aligned_pairs(da, na, db, nb)
    pairing = "aligned"
    if pairs is None:
        pairs, pairing = index_pairs(same, na), "by index"
    paired = pairs >= 0
    return {
        "a": str(a.path), "b": str(b.path), "steps_a": na, "steps_b": nb,
        "config_differences": config_differences(a.meta, b.meta),
        "requests_a": int(len(a.requests)), "requests_b": int(len(b.requests)),
        "matched_steps": matched, "decision_match_rate": matched / n if n else 1.0,
        "aligned_matched_steps": int(paired.sum()) if pairing == "aligned" else None,
        "first_divergent_step": first,
        "divergence": [asdict(d) for d in explain_step(da[da["step"] == first], db[db["step"] == first])]
        if first is not None else [],
        "metrics": metrics, "step_time_mape": mape, "steps_aligned": k,
        "identical_step_time_mape": _mape(ta[paired], tb[pairs[paired]]), "identical_steps_paired": pairing,
        "attribution": attribute(a, b, pairs, pairing),
        "same_shape_speed": _speed(a, b),
        "interval": interval_coverage(a, b),
    }


def _metrics(a: Trace, b: Trace) -> dict[str, dict[str, Any]]:
    sa, sb = summarize(a.requests, a.steps), summarize(b.requests, b.steps)
    return {m: {"a": _clean(sa.get(m)), "b": _clean(sb.get(m)), "rel_error": _rel(sa.get(m), sb.get(m))}
            for m in METRICS}


def _requests_only(a: Trace, b: Trace) -> dict[str, Any]:
    """The report when a trace has no steps: request metrics, and the step-level entries empty."""
    bare = [name for name, t in (("A", a), ("B", b)) if not len(t.steps)]
    which = f"{' and '.join(bare)} {'have' if len(bare) > 1 else 'has'}"
    return {
        "a": str(a.path), "b": str(b.path), "steps_a": len(a.steps), "steps_b": len(b.steps),
        "config_differences": config_differences(a.meta, b.meta), "requests_a": int(len(a.requests)), "requests_b": int(len(b.requests)),
        "step_level_skipped": f"{which} requests but no steps or decisions (a measured run's per-request "
                              "times, e.g. from sim import-run): only request metrics are compared",
        "matched_steps": 0, "decision_match_rate": None, "aligned_matched_steps": None,
        "first_divergent_step": None, "divergence": [], "metrics": _metrics(a, b), "step_time_mape": None,
        "steps_aligned": 0, "identical_step_time_mape": None, "identical_steps_paired": None, "attribution": None,
        "same_shape_speed": None, "interval": interval_coverage(a, b),
    }


def interval_coverage(a: Trace, b: Trace) -> dict[str, Any] | None:
    """Where A's metrics fall against the interval B predicts (a replay with `--samples` keeps it in its
    meta): per metric inside or not, and how many are; None when B holds no interval."""
    prediction = b.meta.get("prediction")
    if not isinstance(prediction, dict) or not isinstance(prediction.get("metrics"), dict):
        return None
    measured = summarize(a.requests, a.steps)
    metrics = {}
    for name, r in prediction["metrics"].items():
        value, lo, hi = _clean(measured.get(name)), r.get("p5"), r.get("p95")
        inside = bool(lo <= value <= hi) if None not in (value, lo, hi) else None
        metrics[name] = {"a": value, "p5": lo, "p50": r.get("p50"), "p95": hi, "inside": inside}
    scored = [m["inside"] for m in metrics.values() if m["inside"] is not None]
    return {"num_samples": prediction.get("num_samples"), "interval": prediction.get("interval", "p5-p95"),
            "metrics": metrics, "inside": sum(scored), "scored": len(scored)}


def _interval_lines(r: dict[str, Any]) -> list[str]:
    iv = r.get("interval")
    if not iv:
        return []
    lines = [f"A inside B's prediction ({iv['interval']} over {iv['num_samples']} seeded replays): "
             f"{iv['inside']} of {iv['scored']} metrics"]
    for name, m in iv["metrics"].items():
        label, scale, unit = metric_label(name)
        if m["inside"] is None:
            lines.append(f"  {label:<22} n/a")
            continue
        verdict = "inside" if m["inside"] else ("below" if m["a"] < m["p5"] else "above")
        lines.append(f"  {label:<22} {m['a'] * scale:10.2f} {unit} {verdict:<6} "
                     f"[{m['p5'] * scale:.2f}-{m['p95'] * scale:.2f}]")
    return lines


def _speed(a: Trace, b: Trace) -> dict[str, Any] | None:
    shift = same_shape_speed(a, b)
    return None if shift is None else {"ratio": shift.ratio, "shapes": shift.shapes, "steps": shift.steps}


def _durations(steps: pd.DataFrame) -> np.ndarray:
    s = steps.sort_values("step")
    return (s["end"] - s["start"]).to_numpy(float)


def _mape(ta: np.ndarray, tb: np.ndarray) -> float | None:
    """Mean absolute percentage error of B's step durations against A's, over A's steps that took time."""
    pos = ta > 0
    return float(np.mean(np.abs(tb[pos] - ta[pos]) / ta[pos])) if pos.any() else None


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and v != v else v


def _metric_lines(r: dict[str, Any]) -> list[str]:
    lines = [f"{'metric':<24} {'A':>13} {'B':>13} {'rel.err':>9}"]
    for name, m in r["metrics"].items():
        label, scale, unit = metric_label(name)
        fa = "n/a" if m["a"] is None else f"{m['a'] * scale:.2f} {unit}"
        fb = "n/a" if m["b"] is None else f"{m['b'] * scale:.2f} {unit}"
        err = "n/a" if m["rel_error"] is None else f"{m['rel_error'] * 100:+.2f}%"
        lines.append(f"{label:<24} {fa:>13} {fb:>13} {err:>9}")
    return lines


def format_report(r: dict[str, Any]) -> str:
    lines = [f"A: {r['a']} ({r['steps_a']} steps, {r['requests_a']} requests)",
             f"B: {r['b']} ({r['steps_b']} steps, {r['requests_b']} requests)"]
    if r.get("config_differences"):
        lines.append(f"warning: the runs were configured differently: {', '.join(r['config_differences'])}")
    if r.get("step_level_skipped"):
        lines.append(f"step-level comparison skipped: {r['step_level_skipped']}")
        return "\n".join(lines + _metric_lines(r) + _interval_lines(r))
    lines.append(f"decision match: {r['decision_match_rate'] * 100:.2f}% of steps ({r['matched_steps']} of "
                 f"{max(r['steps_a'], r['steps_b'])})")
    aligned = r.get("aligned_matched_steps")
    if aligned is not None and aligned != r["matched_steps"]:
        lines.append(f"decision match once aligned: {aligned / max(r['steps_a'], r['steps_b'], 1) * 100:.2f}% "
                     f"({aligned} steps; steps one trace has and the other lacks no longer shift the rest)")
    if r["first_divergent_step"] is None:
        lines.append("first divergent step: none (identical decisions at every step)")
    else:
        lines.append(f"first divergent step: {r['first_divergent_step']}")
        for d in r["divergence"]:
            lines.append(f"  {d['request_id']}: " + "; ".join(d["differences"]))
    lines.extend(_metric_lines(r))
    lines.extend(_interval_lines(r))
    mape = r["step_time_mape"]
    lines.append(f"step time MAPE: {'n/a' if mape is None else f'{mape * 100:.2f}%'} over {r['steps_aligned']} "
                 "steps aligned by index")
    same_mape = r.get("identical_step_time_mape")
    if same_mape is not None:
        lines.append(f"step time MAPE on identical steps: {same_mape * 100:.2f}% over "
                     f"{r['attribution']['identical_steps']} steps that made the same decisions "
                     f"(paired {r['identical_steps_paired']})")
    speed = r.get("same_shape_speed")
    if speed is not None:
        lines.append(f"device time on same-shape decode steps, B / A: {speed['ratio']:.3f} ({speed['shapes']} shapes, "
                     f"{speed['steps']} steps; below 1: B ran the same work faster)")
    if r.get("attribution"):
        lines.extend(format_attribution(r["attribution"]))
    return "\n".join(lines)
