"""A calibration profile (PROFILE.json, written by `sim calibrate`) as typed data.

`sim calibrate` builds a `CostProfile`; the calibrated cost model, `roofline --profile`, the residual
sampler and intake read its fields rather than keys of a dict. A file is validated as it is read, so a
hand-edited or foreign file fails on one line naming the file and every field that is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError, field_validator

from engine.core.bounded_read import read_bounded
from sim.cost_models.parts import DEVICE_TERMS

PROFILE_KIND: Final = "stepscope-cost-profile"
PROFILE_FORMAT_VERSION: Final = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
# Terms added after a profile format first shipped: 0 where an older profile has none.
LATER_COEFFICIENTS = frozenset({"c_pseq"})
MAX_PROBLEMS = 10


class _Data(BaseModel):
    """Fields a version of stepscope does not know are ignored: a newer profile still loads."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class FitStats(_Data):
    """How far a law's prediction is from the measured steps (NaN where the part was never measured)."""

    num_steps: int = 0
    mape: float = float("nan")
    r2: float = float("nan")
    p50_abs_pct: float = float("nan")
    p90_abs_pct: float = float("nan")


class FitReport(FitStats):
    """The device law's error, and each part's (`device`, `host`, `gap`, and the whole `cycle`)."""

    parts: dict[str, FitStats] = Field(default_factory=dict)


class HeldOut(FitReport):
    """The error on one trace of laws fitted on the others."""

    trace: str


class PartLaw(_Data):
    """One part's linear law in the batch's shape, and measured / predicted over all the steps."""

    coefficients: dict[str, NonNegativeFloat]
    mean_ratio: float = 1.0


class ResidualTable(_Data):
    """Measured / law per step (rows in order, columns the parts), sampled in blocks of `block_steps`
    from within each calibration run (`segments`: each run's number of steps)."""

    ratios: list[list[float]]
    block_steps: int = Field(default=1, ge=1)
    segments: list[int] | None = None
    parts: list[str] | None = None


class IntakeFit(_Data):
    """How an idle engine took in arrivals (sim.cost_models.intake)."""

    wake_s: NonNegativeFloat = 0.0
    per_request_s: NonNegativeFloat = 0.0
    first_wake_s: float | None = None
    cold_admits_arrivals: bool | None = None
    num_wakes: int = 0
    num_adds: int = 0
    wake_samples_s: list[float] = Field(default_factory=list)


class TraceRef(_Data):
    path: str
    source: str | None = None
    complete: bool | None = None
    num_steps: int = 0
    model: str | None = None
    device: str | None = None


class CostProfile(_Data):
    """A PROFILE.json. `coefficients` is the device law; `parts` has each part's law (none in format 1,
    which is one law for the whole step)."""

    kind: Literal["stepscope-cost-profile"] = PROFILE_KIND
    format_version: Literal[1, 2, 3] = PROFILE_FORMAT_VERSION
    cost_model: str = "calibrated"
    created_at: str | None = None
    coefficients: dict[str, NonNegativeFloat]
    parts: dict[str, PartLaw] = Field(default_factory=dict)
    fit: FitReport | None = None
    leave_one_trace_out: list[HeldOut] = Field(default_factory=list)
    residuals: ResidualTable | None = None
    fitted_range: dict[str, int] = Field(default_factory=dict)
    intake: IntakeFit | None = None
    model: dict[str, Any] = Field(default_factory=dict)
    device: dict[str, Any] = Field(default_factory=dict)
    kv_cache: dict[str, Any] = Field(default_factory=dict)
    effective: dict[str, Any] | None = None
    traces: list[TraceRef] = Field(default_factory=list)

    @field_validator("model", "device", "kv_cache", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("coefficients")
    @classmethod
    def _every_device_term(cls, value: dict[str, float]) -> dict[str, float]:
        missing = [k for k in DEVICE_TERMS if k not in value and k not in LATER_COEFFICIENTS]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return {k: float(value.get(k, 0.0)) for k in DEVICE_TERMS}

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


MAX_PROFILE_BYTES = 64 << 20  # fitted coefficients and residual samples, never a trace's rows


def load_profile(path: str | Path) -> CostProfile:
    """A PROFILE.json, checked; any problem is one ValueError line naming the file and the fields."""
    p = Path(path)
    raw = read_bounded(p, MAX_PROFILE_BYTES, "profile file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ValueError(f"{p}: kind: not a stepscope cost profile (write one with `sim calibrate`)")
    if data.get("format_version") not in READABLE_FORMAT_VERSIONS:
        raise ValueError(f"{p}: format_version is {data.get('format_version')!r}, "
                         f"this stepscope reads {' or '.join(map(str, READABLE_FORMAT_VERSIONS))}")
    return profile_from(data, p)


def profile_from(data: dict[str, Any], source: str | Path) -> CostProfile:
    """A profile from its JSON data (a file's, or a trace's meta), every problem in one line."""
    try:
        return CostProfile.model_validate(data)
    except ValidationError as e:
        problems = [f"{'.'.join(str(x) for x in err['loc'])}: {_what(err)}" for err in e.errors()]
        more = f"; and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise ValueError(f"{source}: {'; '.join(problems[:MAX_PROBLEMS])}{more}") from None


def _what(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, (int, float, str, bool)) and err["type"] != "value_error":
        msg += f", got {value!r}"
    return msg
