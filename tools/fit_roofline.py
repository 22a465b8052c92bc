"""Fit the per-kernel roofline's efficiencies per GPU family to measured kernels, once, and write them to
sim/cost_models/data/roofline_fit.json (which `sim.cost_models.hardware` reads).

Each measured kernel (a GEMM, a pointwise op, a decode or prefill attention call) has known FLOPs and
bytes at its shape; the roofline says time = floor + max(FLOPs / (peak * e_compute), bytes / (bandwidth *
e_memory)). Per family, (mfu_eff, bw_eff, attn_eff, kernel_floor) minimise the squared log error over
every measured kernel of that family's GPUs (scipy least squares). Sources, each with its licence:
profile bundles measured on the GPU (LLMServingSim's, MIT) and the extract of AIConfigurator's databases
(Apache-2.0) under sim/cost_models/data/aic_extract/.

    python tools/fit_roofline.py BUNDLE_DIR=CONFIG.json ... [--aic-extract CSV] [--all-reduce CSV] [-o FILE]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.cost_models.hardware import FIT_FILE, HARDWARE  # noqa: E402
from sim.cost_models.kernel_models import bundle_hardware  # noqa: E402
from sim.cost_models.model_shape import model_shape, rank_shape  # noqa: E402
from sim.cost_models.profile_bundle import read_bundle_meta  # noqa: E402
from sim.cost_models.roofline import RooflineKernels  # noqa: E402

PARAMS = ("mfu_eff", "bw_eff", "pointwise_eff", "attn_eff", "attn_half", "mixed_attn_eff", "kernel_floor",
          "attn_floor")
POINTWISE = ("layernorm", "final_layernorm", "embedding", "rotary_emb", "qk_norm", "act_fn", "sampler")


@dataclass(frozen=True, slots=True)
class Measured:
    """One measured kernel: FLOPs and bytes at its shape, its class (gemm, pointwise, attention), its time."""

    gpu: str
    kind: str
    queries: int
    flops: float
    nbytes: float
    klass: str
    seconds: float
    decode_bytes: float = 0.0  # of nbytes, the decodes' KV read in a call that also holds a prefill chunk


def _shape_terms(rank, kind: str, **k) -> tuple[float, float, str]:
    """FLOPs and bytes of one kernel, read off the roofline's own formulas at unit rates and no floors."""
    from dataclasses import replace

    from sim.cost_models.kernels import AttentionShape

    unit = replace(next(iter(HARDWARE.values())), mfu_eff=1.0, bw_eff=1.0, pointwise_eff=1.0, attn_eff=1.0,
                   attn_half=0.0, kernel_floor=0.0, attn_floor=0.0)
    out = []
    for hw in (replace(unit, peak_flops=1.0, hbm_bandwidth=1e30), replace(unit, peak_flops=1e30, hbm_bandwidth=1.0)):
        timer = RooflineKernels(rank, hw)
        if kind == "attention":
            out.append(timer.attention(AttentionShape(**k)))
        elif kind in ("lm_head", "sampler"):
            out.append(timer.per_sequence(kind, k["n"]))
        else:
            out.append(timer.dense(kind, k["n"]))
    klass = "attention" if kind == "attention" else "pointwise" if kind in POINTWISE else "gemm"
    return out[0], out[1], klass


def from_bundle(bundle: Path, config: Path) -> list[Measured]:
    """Every kernel of every tp<N>/ table of a bundle, at that degree's rank shapes."""
    meta = read_bundle_meta(bundle)
    gpu = bundle_hardware(meta)
    if gpu is None:
        raise SystemExit(f"{bundle}: GPU {meta.get('hardware')!r} is not in the hardware table")
    shape = model_shape(str(config))
    rows: list[Measured] = []
    for d in sorted(bundle.glob("tp*")):
        rank = rank_shape(shape, int(d.name[2:]))
        for r in csv.DictReader((d / "dense.csv").open()):
            if r["layer"] == "qk_norm" and not rank.qk_norm:
                continue
            f, b, a = _shape_terms(rank, r["layer"], n=int(r["tokens"]))
            rows.append(Measured(gpu, r["layer"], int(r["tokens"]), f, b, a, float(r["time_us"]) * 1e-6))
        for r in csv.DictReader((d / "per_sequence.csv").open()):
            f, b, a = _shape_terms(rank, r["layer"], n=int(r["sequences"]))
            rows.append(Measured(gpu, r["layer"], int(r["sequences"]), f, b, a, float(r["time_us"]) * 1e-6))
        for r in csv.DictReader((d / "attention.csv").open()):
            pc, kvp, nd, kvd = (int(r[c]) for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
            f, b, a = _shape_terms(rank, "attention", prefill_chunk=pc, kv_prefill=kvp, n_decode=nd, kv_decode=kvd)
            kind = "mixed_attention" if pc and nd else "decode_attention" if nd else "prefill_attention"
            mixed = nd * kvd * 2 * rank.kv_size * rank.dtype_bytes if pc else 0.0
            rows.append(Measured(gpu, kind, pc + nd, f, b, a, float(r["time_us"]) * 1e-6, mixed))
    return rows


def from_aic_extract(path: Path) -> list[Measured]:
    """The extract's rows carry their own FLOPs and bytes (see its README)."""
    rows = []
    for r in csv.DictReader(path.open()):
        if r["gpu"] not in HARDWARE:
            continue
        rows.append(Measured(r["gpu"], r["kind"], int(r["queries"]), float(r["flops"]), float(r["bytes"]), r["class"],
                             float(r["time_us"]) * 1e-6))
    return rows


def predict(p: np.ndarray, m: list[Measured]) -> np.ndarray:
    mfu, bw, pointwise, attn, half, mixed, floor, attn_floor = p
    out = np.empty(len(m))
    for i, x in enumerate(m):
        hw = HARDWARE[x.gpu]
        if x.klass == "pointwise":
            out[i] = floor + x.nbytes / (hw.hbm_bandwidth * pointwise)
            continue
        if x.klass == "attention":
            compute = x.flops / (hw.peak_flops * attn * x.queries / (x.queries + half))
            nbytes = x.nbytes - x.decode_bytes + x.decode_bytes / mixed
            out[i] = attn_floor + max(compute, nbytes / (hw.hbm_bandwidth * bw))
            continue
        out[i] = floor + max(x.flops / (hw.peak_flops * mfu), x.nbytes / (hw.hbm_bandwidth * bw))
    return out


def fit(m: list[Measured]) -> dict[str, float]:
    """Least squares on log(predicted / measured); each kind of kernel weighs the same in total, so the
    thousands of attention shapes of a bundle do not drown its few GEMMs."""
    seconds = np.array([x.seconds for x in m])
    kinds: dict[str, int] = {}
    for x in m:
        kinds[x.kind] = kinds.get(x.kind, 0) + 1
    weight = np.array([1.0 / np.sqrt(kinds[x.kind]) for x in m])
    mixed = any(x.decode_bytes for x in m)
    res = least_squares(lambda p: weight * np.log(predict(p, m) / seconds),
                        x0=[0.6, 0.8, 0.8, 0.5, 256, 1.0, 3e-6, 8e-6],
                        bounds=([0.05, 0.05, 0.05, 0.02, 0.0, 0.05 if mixed else 0.999, 0.0, 0.0],
                                [1.0, 1.0, 4.0, 1.0, 1e5, 1.0, 1e-4, 1e-4]),
                        x_scale=[0.1, 0.1, 0.1, 0.1, 100, 0.1, 1e-6, 1e-6])
    ratio = predict(res.x, m) / seconds
    out: dict = {k: float(f"{v:.4g}") for k, v in zip(PARAMS, res.x)}
    by_kind = {k: float(f"{np.median(np.abs(np.log(ratio[[x.kind == k for x in m]]))):.4g}") for k in sorted(kinds)}
    out.update({"kernels": len(m), "median_abs_log_error": float(f"{np.median(np.abs(np.log(ratio))):.4g}"),
                "median_abs_log_error_by_kind": by_kind, "gpus": sorted({x.gpu for x in m})})
    if not mixed:
        out["mixed_attn_eff_note"] = "no mixed prefill+decode attention measured for this family: 1 (no penalty)"
    return out


def fit_links(path: Path) -> dict[str, dict]:
    """Per link kind (NVLink, PCIe), the latency per ring hop and the share of the link's bandwidth that
    vLLM's measured all-reduces reach, fitted to each vLLM version's rows (newest version as the
    default): t = 2(tp-1) * latency + 2(tp-1)/tp * bytes / (link bandwidth * eff)."""
    rows: dict[tuple[str, str], list[tuple[str, int, float, float]]] = {}
    for r in csv.DictReader(path.open()):
        if r["gpu"] in HARDWARE:
            key = (HARDWARE[r["gpu"]].interconnect, r["vllm_version"])
            rows.setdefault(key, []).append((r["gpu"], int(r["tp"]), float(r["message_bytes"]),
                                             float(r["time_us"]) * 1e-6))

    def model(p: np.ndarray, rs: list) -> np.ndarray:
        lat, eff = p
        return np.array([2 * (tp - 1) * lat + 2 * (tp - 1) / tp * b / (HARDWARE[g].link_bandwidth * eff)
                         for g, tp, b, _ in rs])

    out: dict[str, dict] = {}
    for (link, version), rs in sorted(rows.items(), key=lambda kv: (kv[0][0], _version(kv[0][1]))):
        t = np.array([x[3] for x in rs])
        res = least_squares(lambda p, rs=rs, t=t: np.log(model(p, rs) / t), x0=[5e-6, 0.5],
                            bounds=([0.0, 0.01], [1e-3, 1.0]), x_scale=[1e-6, 0.1])
        err = float(np.median(np.abs(np.log(model(res.x, rs) / t))))
        fitted = {"link_latency": float(f"{res.x[0]:.4g}"), "all_reduce_eff": float(f"{res.x[1]:.4g}"),
                  "rows": len(rs), "gpus": sorted({x[0] for x in rs}), "median_abs_log_error": float(f"{err:.4g}")}
        entry = out.setdefault(link, {"by_vllm_version": {}})
        entry["by_vllm_version"][version] = fitted
        entry.update({k: fitted[k] for k in ("link_latency", "all_reduce_eff")}, vllm_version=version)
    return out


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def borrow(own: dict, rows: list[Measured], default: dict) -> dict:
    """A family with no pointwise kernels measured (AIConfigurator's databases have none) takes the
    pointwise efficiency fitted over every family; its other parameters are its own."""
    if not any(x.klass == "pointwise" for x in rows):
        own["pointwise_eff"] = default["pointwise_eff"]
        own["pointwise_eff_note"] = "no pointwise kernels measured for this family: fitted over all families"
    return own


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundles", nargs="*", metavar="BUNDLE_DIR=CONFIG.json")
    p.add_argument("--aic-extract", type=Path, default=None)
    p.add_argument("--all-reduce", type=Path, default=None, help="measured all-reduces (allreduce.csv)")
    p.add_argument("-o", "--output", type=Path, default=FIT_FILE)
    args = p.parse_args()
    measured: list[Measured] = []
    sources = []
    for item in args.bundles:
        bundle, config = item.split("=", 1)
        measured += from_bundle(Path(bundle), Path(config))
        sources.append(bundle)
    if args.aic_extract:
        measured += from_aic_extract(args.aic_extract)
        sources.append(str(args.aic_extract))
    families: dict[str, list[Measured]] = {}
    for x in measured:
        families.setdefault(HARDWARE[x.gpu].family, []).append(x)
    default = fit(measured)
    fitted = {fam: borrow(fit(rows), rows, default) for fam, rows in sorted(families.items())}
    fitted["default"] = default
    links = fit_links(args.all_reduce) if args.all_reduce else {}
    if args.all_reduce:
        sources.append(str(args.all_reduce))
    out = {"sources": sources, "families": fitted, "interconnects": links}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    for fam, f in fitted.items():
        print(f"{fam}: " + ", ".join(f"{k} {f[k]}" for k in (*PARAMS, "kernels", "median_abs_log_error")))
    for link, f in links.items():
        for version, v in f["by_vllm_version"].items():
            print(f"{link} vLLM {version}: " + ", ".join(f"{k} {v[k]}" for k in v))
    return 0 if all(math.isfinite(f["mfu_eff"]) for f in fitted.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
