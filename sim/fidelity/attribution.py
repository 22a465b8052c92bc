"""Where a replay's latency error comes from: `sim compare`'s breakdown of each metric's difference.

Trace A (the engine) is re-timed on its own decisions, swapping in B's times one part at a time on the
steps where both made identical decisions (each step of A paired with the step of B that made them, once
the traces are aligned: a step one trace lacks does not unpair every later one):

    M0: A's decisions, A's own step parts    (A as the re-timing sees it)
    M1: ... with B's model time (execute) on identical steps
    M2: ... and B's host phases and inter-step gap on identical steps
    MB: trace B itself

so that  MB - M0 = (M1 - M0) step-time error + (M2 - M1) host/gap error + (MB - M2) decision divergence,
exactly: the last term is what other batches or another admission order did (see `attribute`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.report.summary import metric_label
from sim.report.token_stats import token_times
from traces.summary import HEADLINE_METRICS, summarize

if TYPE_CHECKING:
    from traces import Trace


def step_parts(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per step (by index): model time, host time inside the step, gap to the next step while busy, and
    whether the step before it left work (so it started without waiting for an arrival)."""
    s = steps.sort_values("step")
    start, end = s["start"].to_numpy(float), s["end"].to_numpy(float)
    dur = np.maximum(end - start, 0.0)
    execute = s["execute_time"].fillna(0).to_numpy(float) if "execute_time" in s else np.zeros(len(s))
    device = np.where((execute > 0).any(), np.minimum(execute, dur), dur)
    busy = ((s["num_running"] + s["num_waiting"]) > 0).to_numpy().copy()
    busy[-1:] = False
    gap = np.where(busy, np.maximum(np.r_[start[1:], np.inf] - end, 0.0), 0.0)
    return {"start": start, "device": device, "host": dur - device, "gap": gap,
            "after_busy": np.r_[False, busy[:-1]]}


def retime(parts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Step starts and ends on a clock rebuilt from the parts: a step starts when the previous cycle ends,
    or at its recorded start if the engine was idle before it (it waited for an arrival)."""
    start, dev, host, gap, after_busy = (parts[k] for k in ("start", "device", "host", "gap", "after_busy"))
    starts, ends = np.empty(len(start)), np.empty(len(start))
    t = -np.inf
    for i in range(len(start)):
        starts[i] = t if after_busy[i] else max(t, start[i])
        ends[i] = starts[i] + dev[i] + host[i]
        t = ends[i] + gap[i]
    return starts, ends


def warp(times: np.ndarray, steps: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Instants of the trace's own clock carried onto a re-timed one, linearly within each step and each
    gap between steps: an arrival keeps its place among the steps it came between. Without this, a
    re-timed busy spell that runs a few percent slow carries every later first token away from its
    fixed arrival, and the step-time term grows past the whole error while the decision term turns
    negative to make up for it; with it, the step-time term holds only what the re-timed steps add."""
    s = steps.sort_values("step")
    own = np.column_stack([s["start"].to_numpy(float), s["end"].to_numpy(float)]).ravel()
    new = np.column_stack([starts, ends]).ravel()
    known = np.isfinite(own) & np.isfinite(new)
    own, new = own[known], new[known]
    if not len(own):
        return np.asarray(times, dtype=float)
    own, new = np.maximum.accumulate(own), np.maximum.accumulate(new)
    edge = 1e9  # beyond the first and last step the clocks run alike, one shifted from the other
    own = np.r_[own[0] - edge, own, own[-1] + edge]
    new = np.r_[new[0] - edge, new, new[-1] + edge]
    return np.interp(np.asarray(times, dtype=float), own, new)


def metrics_with_ends(trace: Trace, starts: np.ndarray, ends: np.ndarray) -> dict[str, Any]:
    """The summary metrics of `trace`'s decisions if its steps had run from `starts` to `ends`, arrivals
    kept in their places among the steps (`warp`)."""
    steps = trace.steps.sort_values("step")
    codes, times = token_times(trace.decisions, steps.assign(end=ends))
    ids = pd.factorize(trace.decisions["request_id"])[1]
    tok = pd.DataFrame({"request_id": np.asarray(ids)[codes], "t": times}).groupby("request_id")["t"]
    req = trace.requests.set_index("request_id")
    first, last = tok.min().reindex(req.index), tok.max().reindex(req.index)
    req = req.assign(first_token=first, finish=last.where(req["finish"].notna()),
                     arrival=warp(req["arrival"].to_numpy(float), steps, starts, ends),
                     first_scheduled=warp(req["first_scheduled"].to_numpy(float), steps, starts, ends)).reset_index()
    return summarize(req)


def predicted_parts(a: Trace, b: Trace) -> dict[str, np.ndarray] | None:
    """A's steps as B's calibrated cost model (from B's meta) would time them: device, host + gap folded
    into host as the simulator pays them; None when B was not run on a calibrated profile."""
    cm = (b.meta or {}).get("cost_model") or {}
    if cm.get("name") != "calibrated" or not cm.get("coefficients"):
        return None
    from sim.calibration.calibrate import step_batches, step_table
    from sim.cost_models.calibrated import CalibratedCostModel
    from sim.cost_models.profile import profile_from

    model = CalibratedCostModel(profile_from({"coefficients": cm["coefficients"], "parts": cm.get("parts") or {}},
                                             f"{b.path}: meta.json cost_model"))
    table = step_table(a)
    n = len(a.steps)
    out = {"device": np.zeros(n), "host": np.zeros(n), "gap": np.zeros(n)}
    index = {s: i for i, s in enumerate(a.steps.sort_values("step")["step"].to_numpy())}
    for step, batch in zip(table.index, step_batches(table)):
        p = model.step_time(batch, 0)
        i = index[step]
        out["device"][i], out["host"][i], out["gap"][i] = p.device, p.host, p.gap
    return out


def attribute(a: Trace, b: Trace, pairs: np.ndarray, pairing: str = "aligned") -> dict[str, Any]:
    """The breakdown of B - A per metric (seconds, or tok/s for throughput); `pairs[i]` is the step of B
    that made the same decisions as step i of A, or -1 (traces.diff.aligned_pairs). On the unpaired steps
    B's times are the ones its calibrated cost model predicts for A's batches (when B's meta has one),
    else A's own. `pairing` says how the pairs were found ("aligned" or "by index"), for the report.

    M2 stands for "A's decisions on B's times". When every step made the same decisions, that run is B
    itself, so the decision term is zero by definition, and what M2 misses of B (arrivals carried onto
    the re-timed clock, `warp`, are not where B had them) is the re-timing's own error: it joins M0 - MA."""
    pa, pb = step_parts(a.steps), step_parts(b.steps)
    n, nb = len(pa["start"]), len(pb["start"])
    assert len(pairs) == n, (len(pairs), n)
    paired = (pairs >= 0) & (pairs < nb)
    at = np.where(paired, pairs, 0)
    pred = predicted_parts(a, b)
    swap = {}
    for key in ("device", "host", "gap"):
        other = pa[key] if pred is None else pred[key]
        swap[key] = np.where(paired, pb[key][at] if nb else other, other)
    # A step of B's folds its gap into the step; keep A's idle waits (gap 0 after an idle step) as they are.
    if pred is not None:
        swap["host"] = np.where(paired, swap["host"], swap["host"] + np.where(pa["gap"] > 0, swap["gap"], 0.0))
        swap["gap"] = np.where(paired, swap["gap"], 0.0)
    p1 = {**pa, "device": swap["device"]}
    p2 = {**p1, "host": swap["host"], "gap": swap["gap"]}
    m0, m1, m2 = (metrics_with_ends(a, *retime(p)) for p in (pa, p1, p2))
    mb, ma = summarize(b.requests), summarize(a.requests)
    identical = n == nb and bool(paired.all())
    out = {}
    for name in HEADLINE_METRICS:
        va, v0, v1, v2, vb = (m.get(name, np.nan) for m in (ma, m0, m1, m2, mb))
        missed = vb - v2  # B less A's decisions on B's times: decisions, unless the decisions are B's
        out[name] = {"a": va, "b": vb, "total": vb - va, "step_time": v1 - v0, "host_gap": v2 - v1,
                     "divergence": 0.0 if identical else missed,
                     "retiming": v0 - va + (missed if identical else 0.0)}
    return {"identical_steps": int(paired.sum()), "steps_a": n, "identical_decisions": identical,
            "pairing": pairing, "predicted_from": None if pred is None else "B's calibrated cost model", "metrics": out}


def format_attribution(r: dict[str, Any]) -> list[str]:
    other = r.get("predicted_from") or "A's own times"
    pairing = r.get("pairing", "by index")
    lines = [f"error breakdown (B - A; B's times on {r['identical_steps']} of {r['steps_a']} identical steps, "
             f"paired {pairing}, {other} on the others): step time | host+gap | decisions | re-timing"]
    if r.get("identical_decisions"):
        lines.append("  (every decision identical: no decision term; what re-timing A on B's times misses of B "
                     "counts as re-timing)")
    for name, m in r["metrics"].items():
        if not np.isfinite(m["a"]) or m["a"] == 0:
            continue
        p = {k: f"{m[k] / abs(m['a']) * 100:+7.2f}%" for k in ("total", "step_time", "host_gap", "divergence",
                                                                "retiming")}
        lines.append(f"  {metric_label(name)[0]:<24} total {p['total']} = {p['step_time']} | {p['host_gap']} | "
                     f"{p['divergence']} | {p['retiming']}")
    return lines
