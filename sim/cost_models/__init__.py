"""Cost models by name: `recorded` (an engine trace's own step times), `calibrated` (a PROFILE.json fitted
by `sim calibrate`), `roofline` (model shape x hardware table). Each is imported only when asked for."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.cost_models.base import CostModel

COST_MODELS = ("recorded", "calibrated", "roofline")


class CostModelError(ValueError):
    """A cost model that cannot be built; the message is one line naming the flag and value."""


def _missing(name: str, e: ImportError) -> CostModelError:
    return CostModelError(f"--cost-model {name}: not available in this build ({e})")


def get_cost_model(name_or_path: str, source_trace: Any = None, model: str | dict | None = None,
                   hardware: str | None = None, profile: str | Path | None = None,
                   residual_seed: int | None = None) -> CostModel:
    """Build a cost model. `source_trace` is the loaded trace a replay comes from (needed by
    `recorded`); `model` a preset name or HF config dict and `hardware` a name (roofline); `profile`
    a PROFILE.json (calibrated, or measured rates for roofline); `residual_seed` (calibrated) draws one
    sampled replay of the measured residuals instead of the expected step times."""
    name = str(name_or_path)
    if name == "recorded":
        if source_trace is None:
            raise CostModelError("--cost-model recorded: needs an engine trace directory as the source "
                                 "(a workload file has no recorded step times); use roofline or calibrated")
        from sim.cost_models.recorded import RecordedCostModel

        return RecordedCostModel.from_trace(source_trace)
    if name == "roofline":
        try:
            from sim.cost_models.roofline import RooflineCostModel
        except ImportError as e:
            raise _missing(name, e) from None
        if model is None:
            raise CostModelError("--cost-model roofline: needs --model (a preset such as llama-3.1-8b)")
        if hardware is None:
            raise CostModelError("--cost-model roofline: needs --hardware (h100, h200, a100, l4, ...)")
        return RooflineCostModel.from_args(model=model, hardware=hardware, profile=profile)
    if name == "calibrated" or name.endswith(".json") or Path(name).is_file():
        path = profile if name == "calibrated" else name
        if path is None:
            raise CostModelError("--cost-model calibrated: needs --profile PROFILE.json (from `sim calibrate`)")
        if not Path(path).is_file():
            raise CostModelError(f"--cost-model: profile {path} not found")
        try:
            from sim.cost_models.calibrated import CalibratedCostModel
        except ImportError as e:
            raise _missing("calibrated", e) from None
        return CalibratedCostModel.load(path, seed=residual_seed)
    raise CostModelError(f"--cost-model: unknown cost model {name!r} (expected one of {', '.join(COST_MODELS)} "
                         "or a PROFILE.json path)")


__all__ = ["COST_MODELS", "CostModel", "CostModelError", "get_cost_model"]
