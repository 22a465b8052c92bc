"""`sim calibrate TRACE_DIR... -o PROFILE.json`: fit the calibrated cost model to engine traces.

Each step's batch is rebuilt from the trace's decisions (the numbers the scheduler handed the model
runner) and paired with the step's measured `end - start`, the span the simulator advances its clock by.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.batch import StepBatch
from sim.cost_models.calibrated import (COEFFICIENTS, PROFILE_FORMAT_VERSION, PROFILE_KIND, design_matrix,
                                        device_label, error_stats, fit_nnls, model_label, trace_identity)
from sim.cost_models.roofline import DTYPE_BYTES, effective_from_coefficients, model_shape
from traces import Trace, load

_WHAT = {"c0": "step", "c_p": "prefill token", "c_d": "decode token", "c_ctx": "context token",
         "c_attn": "prefill attention pair", "c_seq": "sequence"}


def batches_from_trace(trace: Trace) -> list[tuple[StepBatch, float]]:
    """(batch, end - start) for every step of `trace` that scheduled tokens, in step order."""
    d = trace.decisions
    d = d[(d["event"] == "schedule") & (d["num_tokens"] > 0)]
    if not len(d) or not len(trace.steps):
        return []
    n = d["num_tokens"].to_numpy(dtype=np.int64)
    c = pd.to_numeric(d["num_computed_tokens"]).fillna(0).to_numpy(dtype=np.int64)
    dec = (d["phase"] == "decode").to_numpy()
    per_row = pd.DataFrame({
        "step": d["step"].to_numpy(dtype=np.int64), "pt": np.where(dec, 0, n), "dt": np.where(dec, n, 0),
        "ps": (~dec).astype(np.int64), "ds": dec.astype(np.int64), "ctx": c + n,
        "attn": np.where(dec, 0.0, n * (c + (n + 1) / 2))})
    agg = per_row.groupby("step").sum()
    steps = trace.steps.set_index("step")
    agg = agg.join((steps["end"] - steps["start"]).rename("dur"), how="inner")
    return [(StepBatch(int(r.pt), int(r.dt), int(r.ps), int(r.ds), int(r.ctx), float(r.attn)), float(r.dur))
            for r in agg.itertuples()]


def _stack(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.vstack([x for x, _ in parts]), np.concatenate([y for _, y in parts])


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


def calibrate(traces: list[Trace]) -> tuple[dict[str, Any], list[str]]:
    """The PROFILE.json content fitted on `traces`, and warnings worth showing the user."""
    parts = []
    for t in traces:
        pairs = batches_from_trace(t)
        if not pairs:
            raise ValueError(f"{t.path}: no steps that scheduled tokens, nothing to calibrate on")
        parts.append((design_matrix([b for b, _ in pairs]), np.array([s for _, s in pairs])))
    x, y = _stack(parts)
    coef, keep = fit_nnls(x, y)
    pred = x @ coef
    fit = {**error_stats(y[keep], pred[keep]), "num_outliers": int((~keep).sum()),
           "all_steps_mape": error_stats(y, pred)["mape"]}
    loto = []
    for i, t in enumerate(traces if len(traces) > 1 else []):
        held_x, held_y = parts[i]
        c, _ = fit_nnls(*_stack(parts[:i] + parts[i + 1:]))
        loto.append({"trace": str(t.path), **error_stats(held_y, held_x @ c)})
    idents = [trace_identity(t.meta) for t in traces]
    warns = _identity_warnings(traces, idents)
    warns += [f"no step has {_WHAT[k]}s: {k} fixed at 0" for k, col in zip(COEFFICIENTS, x.T) if not col.any()]
    if fit["num_outliers"] > 0.1 * len(y):
        warns.append(f"{fit['num_outliers']} of {len(y)} steps lie beyond 3 MAD of the fit and were dropped: "
                     f"the law describes these traces poorly")
    coefficients = {k: float(v) for k, v in zip(COEFFICIENTS, coef)}
    ident = idents[0]
    profile = {
        "kind": PROFILE_KIND, "format_version": PROFILE_FORMAT_VERSION, "cost_model": "calibrated",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": ident["model"], "device": ident["device"], "kv_cache": ident["kv_cache"],
        "coefficients": coefficients, "fit": fit, "leave_one_trace_out": loto,
        # How measured steps scatter around the law (all steps, outliers too: real runs have them).
        "residual_quantiles": [float(q) for q in np.quantile(y / np.maximum(pred, 1e-12), np.linspace(0, 1, 101))],
        "effective": _effective(coefficients, ident["model"]),
        "traces": [{"path": str(t.path), "source": t.source, "complete": t.complete, "num_steps": int(len(p[1])),
                    "model": model_label(i), "device": device_label(i)} for t, p, i in zip(traces, parts, idents)],
    }
    return profile, warns


def _effective(coefficients: dict[str, float], model: dict[str, Any]) -> dict[str, Any] | None:
    """Measured FLOP/s and bandwidth (what `roofline --profile` uses), when the traces carry a model shape."""
    if not model.get("hf_config"):
        return None
    dtype = model.get("dtype") if model.get("dtype") in DTYPE_BYTES else "bfloat16"
    try:
        return effective_from_coefficients(coefficients, model_shape(model["hf_config"], dtype))
    except ValueError as e:
        return {"error": str(e)}


def _seconds(v: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-12:.3g} ps" if v else "0"


def report_lines(profile: dict[str, Any], output: str | None = None) -> list[str]:
    """What `sim calibrate` prints: data, fit error, held-out error, coefficients, effective peaks."""
    fit, ident = profile["fit"], {"model": profile["model"], "device": profile["device"]}
    lines = [f"calibrated on {len(profile['traces'])} trace(s), {fit['num_steps']} steps "
             f"({fit['num_outliers']} outliers beyond 3 MAD dropped): {model_label(ident)} on {device_label(ident)}",
             f"fit error: MAPE {fit['mape']:.2f}%, R2 {fit['r2']:.4f}, |error| p50 {fit['p50_abs_pct']:.2f}%, "
             f"p90 {fit['p90_abs_pct']:.2f}% (all steps: MAPE {fit['all_steps_mape']:.2f}%)"]
    loto = profile["leave_one_trace_out"]
    if loto:
        each = ", ".join(f"{Path(r['trace']).name} {r['mape']:.2f}%" for r in loto)
        lines.append(f"leave-one-trace-out: MAPE {np.mean([r['mape'] for r in loto]):.2f}% ({each})")
    coef = profile["coefficients"]
    lines.append("coefficients: " + ", ".join(f"{k} {_seconds(coef[k])}/{_WHAT[k]}" for k in COEFFICIENTS))
    eff = profile.get("effective")
    if eff and "error" not in eff:
        lines.append(f"effective: {eff['flops'] / 1e9:.3g} GFLOP/s (from {eff['flops_from']}), "
                     f"{eff['bandwidth'] / 1e9:.3g} GB/s (from {eff['bandwidth_from']})")
    if output:
        lines.append(f"wrote {output}")
    return lines


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise _ArgError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sim calibrate", description="Fit a calibrated cost model (PROFILE.json) to engine traces.")
    p.add_argument("traces", nargs="+", metavar="TRACE_DIR", help="engine trace directories")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    return p


def _load(path: str, warns: list[str]) -> Trace:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load(path)
    warns.extend(str(w.message) for w in caught)
    return trace


def main_calibrate(argv: list[str] | None = None) -> int:
    """Exit status: 0 on success, 2 (after one `sim calibrate: error:` line) on bad input."""
    try:
        args = build_parser().parse_args(argv)
    except _ArgError as e:
        print(f"sim calibrate: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return int(e.code or 0)
    warns: list[str] = []
    try:
        out = Path(args.output)
        if not out.parent.is_dir():
            raise ValueError(f"{out}: directory {out.parent} does not exist")
        profile, fit_warns = calibrate([_load(p, warns) for p in args.traces])
        out.write_text(json.dumps(profile, indent=2, default=str) + "\n")
    except (ValueError, OSError) as e:
        print(f"sim calibrate: error: {e}", file=sys.stderr)
        return 2
    for w in warns + fit_warns:
        print(f"sim calibrate: warning: {w}", file=sys.stderr)
    for line in report_lines(profile, str(out)):
        print(line)
    return 0
