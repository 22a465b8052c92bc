"""Accelerators the roofline model knows: peak dense bf16 FLOP/s, memory bandwidth and capacity from
the vendors' public spec sheets, plus how much of those peaks a serving engine actually reaches.

The efficiency factors are deliberately round defaults, not measurements: large prefill GEMMs reach
roughly half to two thirds of peak, decode GEMVs roughly four fifths of HBM bandwidth. `sim calibrate`
replaces guesses with measured numbers (see `RooflineCostModel.from_args(..., profile=...)`); the CPU
has no spec-sheet entry at all and exists only through calibration.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

GiB = 1 << 30
TERA = 1e12


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator. `peak_flops` and `hbm_bandwidth` are the spec-sheet peaks (FLOP/s, bytes/s);
    the model uses `peak_flops * mfu_eff` and `hbm_bandwidth * bw_eff`. Overheads are seconds of
    host-side work per step and per scheduled sequence (input preparation, sampling bookkeeping)."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    memory_bytes: int | None
    mfu_eff: float = 0.6
    bw_eff: float = 0.8
    step_overhead: float = 3e-4
    seq_overhead: float = 5e-6
    note: str = ""

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.mfu_eff

    @property
    def effective_bandwidth(self) -> float:
        return self.hbm_bandwidth * self.bw_eff

    def to_dict(self) -> dict:
        return asdict(self)


# Memory sizes are roughly what a CUDA process sees (a little under the marketing figure).
HARDWARE: dict[str, Hardware] = {
    "h100": Hardware("h100", 989 * TERA, 3.35e12, int(79.1 * GiB), note="H100 SXM5 80GB, HBM3"),
    "h100-pcie": Hardware("h100-pcie", 756 * TERA, 2.0e12, int(79.1 * GiB), note="H100 PCIe 80GB, HBM2e"),
    "h200": Hardware("h200", 989 * TERA, 4.8e12, int(139.8 * GiB), note="H200 SXM 141GB, HBM3e"),
    "a100": Hardware("a100", 312 * TERA, 2.039e12, int(79.2 * GiB), mfu_eff=0.65, note="A100 SXM 80GB, HBM2e"),
    "a100-40gb": Hardware("a100-40gb", 312 * TERA, 1.555e12, int(39.4 * GiB), mfu_eff=0.65,
                          note="A100 SXM 40GB, HBM2"),
    "l40s": Hardware("l40s", 362 * TERA, 0.864e12, int(44.4 * GiB), mfu_eff=0.5, note="L40S 48GB, GDDR6"),
    "l4": Hardware("l4", 121 * TERA, 0.3e12, int(22.0 * GiB), mfu_eff=0.5, note="L4 24GB, GDDR6"),
}
# Names that exist only through a calibration profile (no spec sheet describes "a CPU").
CALIBRATION_ONLY = ("cpu",)


def hardware_names() -> list[str]:
    return sorted(HARDWARE) + [f"{n} (needs a calibration profile)" for n in CALIBRATION_ONLY]


def get_hardware(name: str) -> Hardware:
    """The spec-sheet entry for `name` (case-insensitive); a clear error lists the valid names."""
    key = name.strip().lower()
    if key in HARDWARE:
        return HARDWARE[key]
    if key in CALIBRATION_ONLY:
        raise ValueError(f"hardware {name!r} has no spec-sheet numbers: pass a calibration profile "
                         f"(sim calibrate TRACE_DIR... -o PROFILE.json) to measure it")
    raise ValueError(f"unknown hardware {name!r}; valid: {', '.join(hardware_names())}")
