"""The calibrated cost model: each part of a step cycle (sim.cost_models.parts) as a non-negative linear
law in the batch's shape, fitted to measured engine steps by `sim calibrate`. The model's own time is

    execute = c0 + c_p * prefill_tokens + c_d * decode_tokens + c_ctx * context_tokens
              + c_attn * prefill_attention + c_seq * num_seqs + c_pseq * prefill_seqs

Each term is a physical cost (fixed launch/weight read, per-token matmuls, KV reads, causal attention,
per-sequence bookkeeping, what a prefill sequence costs beyond its tokens), so none can be negative: the
fit is NNLS, not plain least squares. Without c_pseq a law fitted on many short prompts puts their
fixed cost into c_p and times longer prompts too slow (held out in bench/fidelity.py).
The host phases and the gap before the next step have laws of their own, and the measured scatter
around all three is replayed from the profile's residual table (sim.cost_models.residuals).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults, CostModelInfo, StepTiming
from sim.cost_models.parts import DEVICE_TERMS, PART_TERMS, PARTS, RANGE_FIELDS, TERM_UNITS, part_features
from sim.cost_models.residuals import ResidualSampler
from sim.cost_models.intake import Intake
from sim.cost_models.profile import LATER_COEFFICIENTS, CostProfile, FitStats, load_profile

UNITS = {k: f"s/{TERM_UNITS[k]}" for k in DEVICE_TERMS}


def coefficient(coefficients: dict[str, float], name: str) -> float:
    """A law's coefficient as stored; a term newer than the profile reads as 0, any other missing raises."""
    return coefficients.get(name, 0.0) if name in LATER_COEFFICIENTS else coefficients[name]


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (scipy's Lawson-Hanson): step-time costs cannot be negative."""
    from scipy.optimize import nnls as scipy_nnls

    return scipy_nnls(a, b, maxiter=50 * a.shape[1])[0]


def error_stats(y: np.ndarray, pred: np.ndarray) -> FitStats:
    """MAPE, R^2 and the median / 90th percentile absolute percentage error."""
    ape = np.abs(pred - y) / np.maximum(np.abs(y), 1e-12) * 100
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return FitStats(num_steps=int(len(y)), mape=float(ape.mean()), r2=r2, p50_abs_pct=float(np.percentile(ape, 50)),
                    p90_abs_pct=float(np.percentile(ape, 90)))


def trace_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """What a trace says about the model, device and KV cache it ran on (for profiles and mismatch checks)."""
    model = (meta.get("config") or {}).get("model") or {}
    device = meta.get("device") or {}
    return {"model": {k: model.get(k) for k in ("model", "source", "architecture", "dtype", "hf_config")},
            "device": {k: device.get(k) for k in ("type", "name", "memory_bytes", "num_threads")},
            "kv_cache": meta.get("kv_cache")}


def model_label(ident: dict[str, Any]) -> str:
    m = ident.get("model") or {}
    return f"{m.get('model') or '?'} ({m.get('architecture') or '?'}, {m.get('dtype') or '?'})"


def device_label(ident: dict[str, Any]) -> str:
    d = ident.get("device") or {}
    return f"{d.get('type') or '?'} ({d.get('name') or '?'})"


class CalibratedCostModel(CostModelDefaults):
    """The fitted laws; `load` reads a PROFILE.json written by `sim calibrate`. With a `seed`, each step
    is scaled by measured residual ratios drawn in blocks (one sampled replay); without, by the mean ratio
    (the expected step). A profile without parts (format 1) is one law for the whole step."""

    name = "calibrated"
    intake: Intake | None = None

    def __init__(self, profile: CostProfile, path: str | None = None, seed: int | None = None) -> None:
        self.profile = profile
        self.coefficients = dict(profile.coefficients)
        self._coef = [self.coefficients[k] for k in DEVICE_TERMS]
        self.path = path
        laws = profile.parts
        self._laws = {p: ([float(coefficient(laws[p].coefficients, k)) for k in PART_TERMS[p]], laws[p].mean_ratio)
                      for p in PARTS if p in laws}
        self._laws["device"] = (self._coef, self._laws.get("device", (None, 1.0))[1])
        self.seed = seed
        table = profile.residuals
        self._sampler = ResidualSampler(table, seed) if seed is not None and table is not None else None
        self.intake = Intake.from_fit(profile.intake, seed)
        self._range = dict(profile.fitted_range)
        self._outside: dict[str, int] = {}
        self._num_steps = 0

    @property
    def has_residuals(self) -> bool:
        """A profile with its measured residual table (`sim calibrate` writes one); a format-1 profile has none."""
        table = self.profile.residuals
        return table is not None and len(table.ratios) > 0

    @classmethod
    def load(cls, path: str | Path, seed: int | None = None) -> CalibratedCostModel:
        return cls(load_profile(path), str(path), seed)

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """Device, host and gap seconds of this step (async scheduling may overlap host with device)."""
        self._check_range(batch)
        mult = self._sampler.at(step) if self._sampler is not None else None
        out = []
        for i, part in enumerate(PARTS):
            law = self._laws.get(part)
            if law is None:
                out.append(0.0)
                continue
            coef, mean = law
            t = float(np.dot(coef, part_features(part, batch)))
            out.append(t * (mean if mult is None else float(mult[i])))
        return StepTiming(*out)

    def _check_range(self, batch: StepBatch) -> None:
        self._num_steps += 1
        for key, limit in self._range.items():
            get = RANGE_FIELDS.get(key)
            if get is not None and get(batch) > limit:
                self._outside[key] = max(self._outside.get(key, 0), int(get(batch)))

    def range_warning(self) -> str | None:
        """One line when steps of this run had batch shapes beyond those the profile was fitted on."""
        if not self._outside:
            return None
        what = ", ".join(f"{k} up to {v} (fitted up to {self._range[k]})" for k, v in self._outside.items())
        return (f"profile {self.path or ''} used outside the batch shapes it was fitted on: {what}; "
                "step times there are extrapolated")

    def mismatches(self, meta: dict[str, Any]) -> list[str]:
        """Warnings when a trace's model or device is not the one this profile was fitted on."""
        ident, mine = trace_identity(meta), {"model": self.profile.model, "device": self.profile.device}
        out = []
        for key in ("model", "architecture", "dtype"):
            theirs, ours = ident["model"].get(key), mine["model"].get(key)
            if theirs and ours and theirs != ours:
                out.append(f"profile {self.path or ''} was fitted on model {key} {ours!r}, this run uses {theirs!r}")
        for key in ("type", "name"):
            theirs, ours = ident["device"].get(key), mine["device"].get(key)
            if theirs and ours and theirs != ours:
                out.append(f"profile {self.path or ''} was fitted on device {key} {ours!r}, this run uses {theirs!r}")
        return out

    def describe(self) -> CostModelInfo:
        """Labelled with the model and device the profile was fitted on."""
        prof = self.profile
        model = {k: v for k, v in prof.model.items() if k != "hf_config"}
        return CostModelInfo(
            name=self.name, model=model.get("model"), hardware=prof.device.get("name") or prof.device.get("type"),
            fitted_model=model if model.get("model") else None,
            meta={"name": self.name, "path": self.path, "coefficients": dict(self.coefficients), "units": UNITS,
                  "model": model, "device": prof.device, "fit": prof.fit.model_dump() if prof.fit else None,
                  "leave_one_trace_out": [r.model_dump() for r in prof.leave_one_trace_out],
                  "parts": {p: law.model_dump() for p, law in prof.parts.items()},
                  "seed": self.seed, "fitted_range": self._range, "traces": [t.path for t in prof.traces]})
