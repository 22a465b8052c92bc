"""Accelerators the cost models know: the vendors' datasheet peaks (dense bf16 FLOP/s, memory bandwidth
and size, the GPU-to-GPU link tensor parallelism all-reduces over), and how much of those peaks the
kernels of a serving engine reach, per GPU family, fitted to measured kernels (`roofline_fit.json`,
written by `tools/fit_roofline.py`; see its README for the data).

`--hardware FILE.yaml` describes a GPU that is not in the table (see `load_hardware_file`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from engine.core.bounded_read import read_mapping

GiB = 1 << 30
TERA = 1e12
GB = 1e9
MAX_HARDWARE_FILE_BYTES = 1 << 16
FIT_FILE = Path(__file__).with_name("data") / "roofline_fit.json"
FP8_FAMILIES = ("ada", "hopper", "blackwell", "blackwell-rtx")


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator. Peaks are the datasheet's; the roofline multiplies them by the efficiencies.

    `mfu_eff`: share of peak FLOP/s a large GEMM reaches; `bw_eff`: share of memory bandwidth a GEMM or
    attention kernel streaming its operands reaches; `pointwise_eff`: the same for norms, rotary,
    activation and sampling (small working sets that caches serve in part, so it may pass 1); `attn_eff`:
    share of peak FLOP/s prefill attention tends to as its chunk grows, reaching half of it at `attn_half`
    query tokens (small chunks leave the GPU's units idle); `mixed_attn_eff`: the share of `bw_eff` decodes
    reach when a prefill chunk shares their attention call (varlen kernels give up split-KV); `kernel_floor` and `attn_floor`: seconds the smallest kernel and the
    smallest attention call take (launch and tail), added to every such kernel;
    `link_bandwidth` (bytes/s, one direction) and `link_latency` (s) price all-reduces, of which
    `all_reduce_eff` of the link's bandwidth is reached. `step_overhead`/`seq_overhead`: host seconds per
    step and per scheduled sequence, for synchronous scheduling (async scheduling hides them)."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    memory_bytes: int | None
    family: str = "default"
    interconnect: str = "pcie"
    link_bandwidth: float = 32 * GB
    link_latency: float = 10e-6
    mfu_eff: float = 0.6
    bw_eff: float = 0.8
    attn_eff: float = 0.5
    attn_half: float = 256.0
    mixed_attn_eff: float = 1.0
    pointwise_eff: float = 0.8
    kernel_floor: float = 3e-6
    attn_floor: float = 8e-6
    all_reduce_eff: float = 0.5
    step_overhead: float = 3e-4
    seq_overhead: float = 5e-6
    note: str = ""

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.mfu_eff

    @property
    def fp8_speedup(self) -> float:
        """FP8 peak over bf16 peak: twice on GPUs with FP8 tensor cores (Ada, Hopper, Blackwell); 1 elsewhere,
        where vLLM runs fp8 checkpoints as weight-only (the bytes halve, the math does not)."""
        return 2.0 if self.family in FP8_FAMILIES else 1.0

    @property
    def effective_bandwidth(self) -> float:
        return self.hbm_bandwidth * self.bw_eff

    def all_reduce_time(self, nbytes: float, tp: int) -> float:
        """A ring all-reduce of `nbytes` over `tp` GPUs: each sends and receives 2(tp-1)/tp of the data
        and pays one link latency per ring hop."""
        if tp <= 1 or nbytes <= 0:
            return 0.0
        hops = 2 * (tp - 1)
        return hops * self.link_latency + hops / tp * nbytes / (self.link_bandwidth * self.all_reduce_eff)

    def gather_time(self, nbytes: float, tp: int) -> float:
        """Gathering `nbytes` from each of `tp` GPUs onto one (the logits): every peer sends its share."""
        if tp <= 1 or nbytes <= 0:
            return 0.0
        return self.link_latency + (tp - 1) * nbytes / (self.link_bandwidth * self.all_reduce_eff)

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu(name: str, tflops: float, tbps: float, gib: float, family: str, link: str, link_gbps: float,
         note: str) -> Hardware:
    return Hardware(name, tflops * TERA, tbps * TERA, int(gib * GiB), family=family, interconnect=link,
                    link_bandwidth=link_gbps * GB, link_latency=5e-6 if link == "nvlink" else 10e-6, note=note)


# Datasheet figures: dense bf16 tensor FLOP/s (no sparsity; FP32 accumulate), memory bandwidth, memory as
# a CUDA process sees it, and the link one GPU reaches its peers by, per direction. Sources: NVIDIA's
# datasheets for each product (H100, H200, B200, A100, L40S, L4, RTX PRO 6000 Blackwell Server Edition)
# and the Ada architecture whitepaper (RTX 4090).
_DATASHEET = (
    _gpu("h100", 989, 3.35, 79.1, "hopper", "nvlink", 450, "H100 SXM5 80GB, HBM3; NVLink 4 (900 GB/s both ways)"),
    _gpu("h100-pcie", 756, 2.0, 79.1, "hopper", "pcie", 64, "H100 PCIe 80GB, HBM2e; PCIe Gen5 x16"),
    _gpu("h200", 989, 4.8, 139.8, "hopper", "nvlink", 450, "H200 SXM 141GB, HBM3e; NVLink 4"),
    _gpu("b200", 2250, 8.0, 178.0, "blackwell", "nvlink", 900,
         "B200 (HGX) 180GB, HBM3e; 4.5 PFLOPS bf16 with sparsity, half dense; NVLink 5 (1.8 TB/s both ways)"),
    _gpu("a100", 312, 2.039, 79.2, "ampere", "nvlink", 300, "A100 SXM 80GB, HBM2e; NVLink 3 (600 GB/s both ways)"),
    _gpu("a100-40gb", 312, 1.555, 39.4, "ampere", "nvlink", 300, "A100 SXM 40GB, HBM2; NVLink 3"),
    _gpu("l40s", 362, 0.864, 44.4, "ada", "pcie", 32, "L40S 48GB, GDDR6; PCIe Gen4 x16, no NVLink"),
    _gpu("l4", 121, 0.3, 22.0, "ada", "pcie", 32, "L4 24GB, GDDR6; PCIe Gen4 x16"),
    _gpu("rtx-4090", 165.2, 1.008, 23.6, "ada", "pcie", 32,
         "GeForce RTX 4090 24GB, GDDR6X; 165 TFLOPS bf16 with FP32 accumulate (Ada whitepaper); PCIe Gen4 x16"),
    _gpu("rtx-pro-6000", 500, 1.792, 95.0, "blackwell-rtx", "pcie", 64,
         "RTX PRO 6000 Blackwell Server Edition 96GB, GDDR7; 4 PFLOPS FP4 with sparsity, so 0.5 PFLOPS dense bf16; "
         "PCIe Gen5 x16, no NVLink"),
)
# Names that exist only through a calibration profile (no datasheet describes "a CPU").
CALIBRATION_ONLY = ("cpu",)
_TUNABLE = ("mfu_eff", "bw_eff", "pointwise_eff", "attn_eff", "attn_half", "mixed_attn_eff", "kernel_floor",
            "attn_floor", "all_reduce_eff", "link_latency")


@cache
def family_fit() -> dict[str, dict[str, Any]]:
    """The efficiencies fitted per GPU family (and per interconnect), from the shipped fit file."""
    return json.loads(FIT_FILE.read_text()) if FIT_FILE.is_file() else {"families": {}, "interconnects": {}}


def with_fitted_efficiencies(hw: Hardware, vllm_version: str | None = None) -> Hardware:
    """The family's fitted efficiencies, and the link's fitted all-reduce for `vllm_version` (its own
    measurements where the fit has that version, else the newest version measured)."""
    fit = family_fit()
    fam = fit["families"].get(hw.family) or fit["families"].get("default") or {}
    link = fit["interconnects"].get(hw.interconnect) or {}
    if vllm_version:
        versions = link.get("by_vllm_version") or {}
        minor = ".".join(str(vllm_version).split(".")[:2])
        link = versions.get(str(vllm_version)) or next(
            (v for k, v in versions.items() if ".".join(k.split(".")[:2]) == minor), link)
    # Field overrides by name, all floats (the fit file's JSON); the names are checked against _TUNABLE.
    values: dict[str, Any] = {k: float(v) for k, v in {**fam, **link}.items() if k in _TUNABLE}
    return replace(hw, **values)


def _table() -> dict[str, Hardware]:
    return {hw.name: with_fitted_efficiencies(hw) for hw in _DATASHEET}


HARDWARE: dict[str, Hardware] = _table()


def hardware_names() -> list[str]:
    return sorted(HARDWARE) + [f"{n} (needs a calibration profile)" for n in CALIBRATION_ONLY]


def hardware_help() -> str:
    """The table as `--hardware` help lists it."""
    rows = [f"{h.name} ({h.peak_flops / TERA:.0f} TFLOPS, {h.hbm_bandwidth / TERA:.2f} TB/s, "
            f"{_memory(h)}, {h.interconnect})" for h in HARDWARE.values()]
    return "; ".join(rows) + "; or FILE.yaml describing another GPU"


def _memory(hw: Hardware) -> str:
    return f"{hw.memory_bytes / GiB:.0f} GiB" if hw.memory_bytes is not None else "memory unknown"


def get_hardware(name: str, vllm_version: str | None = None) -> Hardware:
    """The table's entry for `name` (case-insensitive), or a FILE.yaml; a clear error lists the valid names.
    `vllm_version`: price all-reduces as that vLLM version's were measured, where the fit has them."""
    key = str(name).strip().lower()
    if key in HARDWARE:
        return with_fitted_efficiencies(HARDWARE[key], vllm_version) if vllm_version else HARDWARE[key]
    if key in CALIBRATION_ONLY:
        raise ValueError(f"hardware {name!r} has no spec-sheet numbers: pass a calibration profile "
                         f"(sim calibrate TRACE_DIR... -o PROFILE.json) to measure it")
    if key.endswith((".yaml", ".yml")):
        return load_hardware_file(Path(name))
    raise ValueError(f"unknown hardware {name!r}; valid: {', '.join(hardware_names())}, or a FILE.yaml")


# FILE.yaml keys: required datasheet figures in the units people read them in, then optional ones.
_FILE_REQUIRED = {"name": str, "bf16_tflops": float, "memory_bandwidth_tbps": float, "memory_gib": float}
_FILE_OPTIONAL = {"family": str, "interconnect": str, "link_bandwidth_gbps": float, "link_latency_us": float,
                  **{k: float for k in _TUNABLE if k != "link_latency"}}
_SHARES = ("mfu_eff", "bw_eff", "attn_eff", "mixed_attn_eff", "all_reduce_eff")
# [low, high] of each figure, in the file's units: wide enough for any accelerator from a small CPU to well past
# today's largest GPU, narrow enough that sizes and step times stay finite floats and KV block counts ints.
_FILE_RANGES: dict[str, tuple[float, float]] = {
    "bf16_tflops": (1e-3, 1e6),  # 1 GFLOP/s to 1 EFLOP/s
    "memory_bandwidth_tbps": (1e-3, 1e3),  # 1 GB/s to 1 PB/s
    "memory_gib": (1e-3, 1 << 20),  # 1 MiB to 1 PiB
    "link_bandwidth_gbps": (1e-3, 1e6),
    "link_latency_us": (1e-3, 1e6),  # 1 ns to 1 s
    **{k: (1e-3, 1.0) for k in _SHARES},  # a share of a peak, which a share below 1/1000 makes meaningless
    "pointwise_eff": (1e-3, 100.0),  # may pass 1 (caches serve part of the traffic), never by 100x
    "attn_half": (1e-3, float(1 << 24)),  # query tokens: at most any model's context
    "kernel_floor": (1e-12, 1.0),  # seconds per kernel launch
    "attn_floor": (1e-12, 1.0),
}


def load_hardware_file(path: Path) -> Hardware:
    """A GPU described in YAML, e.g. `{name: my-gpu, bf16_tflops: 400, memory_bandwidth_tbps: 2.0,
    memory_gib: 48, family: ada, interconnect: pcie, link_bandwidth_gbps: 32}`; efficiencies come from
    `family` unless given. One-line ValueError naming the file and field otherwise."""
    try:
        doc = read_mapping(path, MAX_HARDWARE_FILE_BYTES, "hardware file", "yaml")
    except ValueError as e:
        raise ValueError(f"--hardware {e}") from None
    unknown = sorted(set(doc) - set(_FILE_REQUIRED) - set(_FILE_OPTIONAL))
    if unknown:
        raise ValueError(f"--hardware {path}: unknown field {unknown[0]!r}; known: "
                         f"{', '.join([*_FILE_REQUIRED, *_FILE_OPTIONAL])}")
    values: dict[str, Any] = {}
    for key, kind in {**_FILE_REQUIRED, **_FILE_OPTIONAL}.items():
        if key not in doc:
            if key in _FILE_REQUIRED:
                raise ValueError(f"--hardware {path}: missing field {key!r}")
            continue
        v = doc[key]
        if kind is float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"--hardware {path}: {key} must be a positive number, got {v!r}")
            lo, hi = _FILE_RANGES[key]
            if key in _SHARES and v > 1:
                raise ValueError(f"--hardware {path}: {key} is a share of the peak, at most 1, got {v}")
            if not lo <= v <= hi:
                raise ValueError(f"--hardware {path}: {key} must be in [{lo:g}, {hi:g}], got {v!r}")
            v = float(v)
        elif not isinstance(v, str) or not v:
            raise ValueError(f"--hardware {path}: {key} must be a non-empty string, got {v!r}")
        values[key] = v
    link = values.get("interconnect", "pcie")
    if link not in ("pcie", "nvlink"):
        raise ValueError(f"--hardware {path}: interconnect must be pcie or nvlink, got {link!r}")
    hw = Hardware(values["name"], values["bf16_tflops"] * TERA, values["memory_bandwidth_tbps"] * TERA,
                  int(values["memory_gib"] * GiB), family=values.get("family", "default"), interconnect=link,
                  link_bandwidth=values.get("link_bandwidth_gbps", 32.0) * GB,
                  link_latency=values.get("link_latency_us", 10.0) * 1e-6, note=f"from {path}")
    hw = with_fitted_efficiencies(hw)
    given = {k: values[k] for k in _TUNABLE if k in values}
    if "link_latency_us" in values:
        given["link_latency"] = values["link_latency_us"] * 1e-6
    return replace(hw, **given)


