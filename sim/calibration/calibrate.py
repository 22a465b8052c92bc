"""`sim calibrate TRACE_DIR... -o PROFILE.json`: fit the calibrated cost model to engine traces.

Each step's batch is rebuilt from the trace's decisions (the numbers the scheduler handed the model
runner) and paired with what the step measurably cost, part by part (sim.cost_models.parts): `execute`
(the model), the host phases around it (`end - start - execute`), and the gap before the next step
while the engine had work. Every part gets a mean law in the batch shape and every step is kept: the
scatter around the laws becomes the residual table the simulator samples from.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.calibration.fit import fit_mean_law, part_stats, ratios
from sim.cost_models.batch import StepBatch, causal_pairs
from sim.cost_models.calibrated import device_label, model_label, trace_identity
from sim.cost_models.intake import fit_intake
from sim.cost_models.parts import PART_TERMS, PARTS, TERM_UNITS, batch_range, part_matrix
from sim.cost_models.profile import CostProfile, FitReport, FitStats, HeldOut, PartLaw, ResidualTable, TraceRef
from sim.cost_models.residuals import level_quantile, levels_from, residual_table, run_levels
from sim.cost_models.roofline import DTYPE_BYTES, effective_from_coefficients, model_shape
from traces import Trace


def step_table(trace: Trace) -> pd.DataFrame:
    """Per step that scheduled tokens: batch columns, and the measured device / host / gap seconds."""
    d = trace.decisions
    d = d[(d["event"] == "schedule") & (d["num_tokens"] > 0)]
    if not len(d) or not len(trace.steps):
        return pd.DataFrame()
    n = d["num_tokens"].to_numpy(dtype=np.int64)
    c = pd.to_numeric(d["num_computed_tokens"]).fillna(0).to_numpy(dtype=np.int64)
    dec = (d["phase"] == "decode").to_numpy()
    per_row = pd.DataFrame({
        "step": d["step"].to_numpy(dtype=np.int64), "pt": np.where(dec, 0, n), "dt": np.where(dec, n, 0),
        "ps": (~dec).astype(np.int64), "ds": dec.astype(np.int64), "ctx": c + n,
        "attn": np.where(dec, 0.0, causal_pairs(n, c))})
    agg = per_row.groupby("step").sum()
    s = trace.steps.sort_values("step").set_index("step")
    dur = (s["end"] - s["start"]).clip(lower=0)
    execute = s["execute_time"].fillna(0).clip(lower=0) if "execute_time" in s else dur * 0
    split = bool((execute > 0).any())
    # The gap counts only while the engine had work left: after an idle step it is waiting for arrivals.
    busy = ((s["num_running"] + s["num_waiting"]) > 0) & s["start"].shift(-1).notna()
    gap = (s["start"].shift(-1) - s["end"]).where(busy, 0.0).clip(lower=0).fillna(0.0)
    parts = pd.DataFrame({"dur": dur, "device": execute if split else dur,
                          "host": (dur - execute).clip(lower=0) if split else dur * 0, "gap": gap, "busy": busy})
    return agg.join(parts, how="inner")


def step_batches(table: pd.DataFrame) -> list[StepBatch]:
    """The batch of each row of a `step_table`."""
    return [StepBatch(int(r.pt), int(r.dt), int(r.ps), int(r.ds), int(r.ctx), float(r.attn))
            for r in table.itertuples()]


def batches_from_trace(trace: Trace) -> list[tuple[StepBatch, float]]:
    """(batch, end - start) for every step of `trace` that scheduled tokens, in step order."""
    table = step_table(trace)
    return list(zip(step_batches(table), table["dur"].astype(float))) if len(table) else []


@dataclass(slots=True)
class StepSamples:
    """One trace's steps: batches and the measured seconds of each part (gap 0 where not measured)."""

    path: str
    batches: list[StepBatch]
    y: dict[str, np.ndarray]

    @classmethod
    def of(cls, trace: Trace) -> StepSamples:
        table = step_table(trace)
        if not len(table):
            raise ValueError(f"{trace.path}: no steps that scheduled tokens, nothing to calibrate on")
        return cls(str(trace.path), step_batches(table), {p: table[p].to_numpy(dtype=float) for p in PARTS})


def _fit(samples: list[StepSamples]) -> dict[str, PartLaw]:
    """Per part: the mean law's coefficients and total measured / total predicted (all steps; ~1)."""
    batches = [b for s in samples for b in s.batches]
    out = {}
    for part in PARTS:
        x, y = part_matrix(part, batches), np.concatenate([s.y[part] for s in samples])
        coef = fit_mean_law(x, y)
        pred = x @ coef
        measured = (y > 0) & (pred > 0)
        out[part] = PartLaw(coefficients={k: float(v) for k, v in zip(PART_TERMS[part], coef)},
                            mean_ratio=float(y[measured].sum() / pred[measured].sum()) if measured.any() else 1.0)
    return out


def _predict(laws: dict[str, PartLaw], part: str, batches: list[StepBatch]) -> np.ndarray:
    law = laws[part]
    coef = np.array([law.coefficients[k] for k in PART_TERMS[part]])
    return part_matrix(part, batches) @ coef * law.mean_ratio


def _stats(laws: dict[str, PartLaw], samples: list[StepSamples]) -> dict[str, FitStats]:
    """Error of the deterministic model (law x mean ratio) per part and on the whole step cycle."""
    batches = [b for s in samples for b in s.batches]
    ys = {p: np.concatenate([s.y[p] for s in samples]) for p in PARTS}
    preds = {p: _predict(laws, p, batches) for p in PARTS}
    out = {p: part_stats(ys[p], preds[p]) for p in PARTS}
    gap_pred = np.where(ys["gap"] > 0, preds["gap"], 0.0)  # no gap is paid before an idle wait
    out["cycle"] = part_stats(ys["device"] + ys["host"] + ys["gap"], preds["device"] + preds["host"] + gap_pred)
    return out


def _identity_warnings(traces: list[Trace], idents: list[dict[str, Any]]) -> list[str]:
    out = []
    for t, ident in zip(traces, idents):
        if t.source not in ("engine", "vllm"):  # vllm: a measured run of real vLLM (engine.vllm_backend)
            out.append(f"{t.path}: source is {t.source!r}, not a measured engine run")
        for label in (model_label, device_label):
            if label(ident) != label(idents[0]):
                out.append(f"{t.path}: runs {label(ident)}, unlike {traces[0].path} ({label(idents[0])}); "
                           f"fitted together anyway")
    return out


def calibrate(traces: list[Trace]) -> tuple[CostProfile, list[str]]:
    """The PROFILE.json content fitted on `traces`, and warnings worth showing the user."""
    samples = [StepSamples.of(t) for t in traces]
    laws = _fit(samples)
    loto = []
    for i, s in enumerate(samples if len(samples) > 1 else []):
        held = _stats(_fit(samples[:i] + samples[i + 1:]), [s])
        loto.append(HeldOut(trace=s.path, **held["device"].model_dump(), parts=held))
    batches = [b for s in samples for b in s.batches]
    table = np.column_stack([ratios(np.concatenate([s.y[p] for s in samples]),
                                    _predict(laws, p, batches) / laws[p].mean_ratio) for p in PARTS])
    idents = [trace_identity(t.meta) for t in traces]
    warns = _identity_warnings(traces, idents)
    x = part_matrix("device", batches)
    warns += [f"no step has {TERM_UNITS[k]}s: {k} fixed at 0" for k, col in zip(PART_TERMS["device"], x.T)
              if not col.any()]
    stats = _stats(laws, samples)
    coefficients = laws["device"].coefficients
    ident = idents[0]
    profile = CostProfile(
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        model=ident["model"], device=ident["device"], kv_cache=ident["kv_cache"],
        coefficients=coefficients, parts=laws,
        fit=FitReport(**stats["device"].model_dump(), parts=stats), leave_one_trace_out=loto,
        residuals=residual_table(table, [len(s.batches) for s in samples]),
        fitted_range=batch_range(batches),
        intake=fit_intake(traces),
        effective=_effective(coefficients, ident["model"]),
        traces=[TraceRef(path=str(t.path), source=t.source, complete=t.complete, num_steps=len(s.batches),
                         model=model_label(i), device=device_label(i)) for t, s, i in zip(traces, samples, idents)])
    return profile, warns


def _effective(coefficients: dict[str, float], model: dict[str, Any]) -> dict[str, Any] | None:
    """Measured FLOP/s and bandwidth (what `roofline --profile` uses), when the traces carry a model shape."""
    if not model.get("hf_config"):
        return None
    named_dtype = model.get("dtype")
    dtype = named_dtype if isinstance(named_dtype, str) and named_dtype in DTYPE_BYTES else "bfloat16"
    try:
        return effective_from_coefficients(coefficients, model_shape(model["hf_config"], dtype))
    except ValueError as e:
        return {"error": str(e)}


def _seconds(v: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-12:.3g} ps" if v else "0"


def _err(st: FitStats) -> str:
    if not st.num_steps:
        return "not measured"
    return f"MAPE {st.mape:.2f}%, R2 {st.r2:.4f}"


def report_lines(profile: CostProfile, output: str | None = None) -> list[str]:
    """What `sim calibrate` prints: data, fit error per part, held-out error, laws, residual model."""
    fit, ident = profile.fit, {"model": profile.model, "device": profile.device}
    steps = f"{fit.num_steps} steps, none dropped" if fit is not None else "no fit report"
    lines = [f"calibrated on {len(profile.traces)} trace(s), {steps}: {model_label(ident)} on {device_label(ident)}"]
    for part, st in [(p, fit.parts[p]) for p in (*PARTS, "cycle")] if fit is not None else []:
        line = f"fit error {part}: {_err(st)}"
        if st.num_steps:
            line += f", |error| p50 {st.p50_abs_pct:.2f}%, p90 {st.p90_abs_pct:.2f}% over {st.num_steps} steps"
        lines.append(line)
    for r in profile.leave_one_trace_out:
        each = "; ".join(f"{p} {_err(r.parts[p])}" for p in (*PARTS, "cycle"))
        lines.append(f"leave-one-trace-out {'/'.join(Path(r.trace).parts[-2:])}: {each}")
    for part in PARTS:
        law = profile.parts[part]
        terms = ", ".join(f"{k} {_seconds(v)}/{TERM_UNITS[k]}" for k, v in law.coefficients.items())
        lines.append(f"law {part}: {terms}; total measured/law {law.mean_ratio:.3f}")
    if profile.residuals is not None:
        lines.extend(_residual_lines(profile.residuals))
    intake = profile.intake
    if intake is not None:
        first = intake.first_wake_s
        admits = {True: "arrivals during it join the first step", False: "arrivals during it wait a step",
                  None: "none arrived during it: taken to join"}[intake.cold_admits_arrivals]
        lines.append(f"intake: an idle engine adds an arrival after {_seconds(intake.wake_s)} (median of "
                     f"{intake.num_wakes} wake-ups; the run's first, cold: "
                     f"{_seconds(first) + '; ' + admits if first is not None else 'not seen'}), then "
                     f"{_seconds(intake.per_request_s)} per request (median of {intake.num_adds} adds)")
    eff = profile.effective
    if eff and "error" not in eff:
        lines.append(f"effective: {eff['flops'] / 1e9:.3g} GFLOP/s (from {eff['flops_from']}), "
                     f"{eff['bandwidth'] / 1e9:.3g} GB/s (from {eff['bandwidth_from']})")
    if output:
        lines.append(f"wrote {output}")
    return lines


def _residual_lines(res: ResidualTable) -> list[str]:
    """The residual table as `sim calibrate` reports it: its spread, and the run levels a replay draws from."""
    ratios_table = np.asarray(res.ratios, dtype=float)
    dev = ratios_table[:, 0]
    lines = [f"residuals: all {len(dev)} steps kept as a table sampled in blocks of {res.block_steps} steps "
             f"(device measured/law p5 {np.percentile(dev, 5):.2f}, p50 {np.percentile(dev, 50):.2f}, "
             f"p95 {np.percentile(dev, 95):.2f}, max {dev.max():.2f})"]
    segments = res.segments or [len(dev)]
    level_segments = levels_from(segments)
    levels = run_levels(ratios_table, level_segments)
    if len(levels) > 1:
        what = ("per calibration run" if level_segments == segments else
                "per part of the one calibration run" if len(segments) == 1 else "per part of each calibration run")
        lo, hi = (float(level_quantile(levels, q)[0]) for q in (0.05, 0.95))
        lines.append(f"run levels (device measured/law, {what}): "
                     f"{', '.join(f'{v:.2f}' for v in levels[:, 0])}; sampled replays run at a new run's likely "
                     f"level given these, p5 {lo:.2f} to p95 {hi:.2f}")
    return lines
