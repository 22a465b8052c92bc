"""Cost models by name: `recorded` (an engine trace's own step times), `calibrated` (a PROFILE.json fitted
by `sim calibrate`), `roofline` (per-kernel, model shape x hardware table), a kernel-profile bundle
directory measured on the target GPU, or `aiconfigurator` (NVIDIA's measured kernel databases, the `aic`
extra). Each is imported only when asked for."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sim.cost_models.base import CostModel
from sim.cost_models.deployment import Deployment

if TYPE_CHECKING:
    from traces import Trace

COST_MODELS = ("recorded", "calibrated", "roofline", "aiconfigurator")
# What the roofline and aiconfigurator price when no --model or --hardware says (a bundle knows its own GPU).
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_HARDWARE = "h100"


class CostModelError(ValueError):
    """A cost model that cannot be built; the message is one line naming the flag and value."""


def _missing(name: str, e: ImportError) -> CostModelError:
    return CostModelError(f"--cost-model {name}: not available in this build ({e})")


def get_cost_model(name_or_path: str, source_trace: Trace | None = None, model: str | dict | None = None,
                   hardware: str | None = None, profile: str | Path | None = None,
                   residual_seed: int | None = None, deployment: Deployment | None = None,
                   async_scheduling: bool = True, vllm_version: str | None = None) -> CostModel:
    """Build a cost model. `source_trace` is the loaded trace a replay comes from (needed by
    `recorded`); `model` a preset name, config.json or HF config dict and `hardware` a name or FILE.yaml
    (roofline, bundle, aiconfigurator; None: DEFAULT_HARDWARE, or a bundle's own GPU); `profile` a PROFILE.json (calibrated, or measured rates for
    roofline); `residual_seed` (calibrated) draws one sampled replay of the measured residuals instead of
    the expected step times. The per-kernel models add host time per step only without async scheduling;
    `vllm_version` (of an imported run) prices all-reduces as that version's were measured; `deployment`
    the parallel layout and dtypes (default: one GPU, the model's dtype) for the models that price any
    batch (`recorded` and `calibrated` price what they measured: the CLI refuses a layout they did not)."""
    name = str(name_or_path)
    deployment = deployment or Deployment()
    if name == "recorded":
        if source_trace is None:
            raise CostModelError("--cost-model recorded: needs an engine trace directory as the source "
                                 "(a workload file has no recorded step times); use roofline or calibrated")
        if not len(source_trace.steps):
            raise CostModelError(f"{source_trace.path}: the trace has no steps, so --cost-model recorded has no step "
                                 "times to replay (use roofline or calibrated)")
        from sim.cost_models.recorded import RecordedCostModel

        return RecordedCostModel.from_trace(source_trace)
    if name == "roofline":
        try:
            from sim.cost_models.roofline import RooflineCostModel
        except ImportError as e:
            raise _missing(name, e) from None
        if model is None:
            raise CostModelError("--cost-model roofline: needs --model (a preset such as llama-3.1-8b)")
        return RooflineCostModel.from_args(model=model, hardware=hardware or DEFAULT_HARDWARE, profile=profile,
                                           deployment=deployment, async_scheduling=async_scheduling,
                                           vllm_version=vllm_version)
    if name == "aiconfigurator":
        from sim.cost_models.kernel_models import aiconfigurator_model

        return aiconfigurator_model(model, hardware or DEFAULT_HARDWARE, deployment, async_scheduling, vllm_version)
    if Path(name).is_dir():
        from sim.cost_models.kernel_models import bundle_model

        return bundle_model(Path(name), model, hardware, deployment, async_scheduling, vllm_version)
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
                         ", a PROFILE.json path or a kernel-profile bundle directory)")


__all__ = ["COST_MODELS", "DEFAULT_HARDWARE", "DEFAULT_MODEL", "CostModel", "CostModelError", "get_cost_model"]
