"""The measured per-kernel cost models, built from what the user names: a profile bundle directory or
AIConfigurator's databases, each with the model's full shape and the GPU's memory and link."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sim.cost_models.deployment import Deployment
from sim.cost_models.hardware import HARDWARE, get_hardware
from sim.cost_models.kernels import KernelSumCostModel
from sim.cost_models.model_shape import model_shape
from sim.cost_models.profile_bundle import ProfileKernels, read_bundle_meta


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def bundle_hardware(meta: dict[str, Any]) -> str | None:
    """The table's name for the GPU a bundle was measured on (`RTXPRO6000` is `rtx-pro-6000`)."""
    label = _plain(str(meta.get("hardware") or ""))
    return next((name for name in HARDWARE if _plain(name) == label), None)


def bundle_model(path: Path, model: str | dict[str, Any] | Path | None, hardware: str | None, deployment: Deployment,
                 async_scheduling: bool, vllm_version: str | None = None) -> KernelSumCostModel:
    """A kernel sum over a bundle's `tp<N>/` tables. The model's full shape (layers, vocabulary) comes from
    `model`, since a bundle profiles one layer; its architecture must be the bundle's."""
    meta = read_bundle_meta(path)
    if model is None:
        raise ValueError(f"--cost-model {path}: needs --model (the profiled model's config.json or preset), since "
                         "a bundle measures one layer")
    shape = deployment.shape(model_shape(model, "float16" if meta.get("variant") in ("fp16", "float16") else "bfloat16"))
    kind = str(meta.get("architecture") or "")
    if kind and kind != shape.model_type and {kind, shape.model_type} != {"llama", "mistral"}:
        raise ValueError(f"--cost-model {path}: the bundle profiles a {kind} model; --model {shape.name} is "
                         f"{shape.model_type}")
    name = hardware or bundle_hardware(meta)
    if name is None:
        raise ValueError(f"--cost-model {path}: the bundle's GPU {meta.get('hardware')!r} is not in the hardware "
                         "table; pass --hardware NAME or FILE.yaml for its memory and link")
    hw = get_hardware(name, vllm_version or meta.get("vllm_version"))
    d = deployment
    return KernelSumCostModel("profile", ProfileKernels(path, d.tensor_parallel_size), shape, hw, d, async_scheduling)


def aiconfigurator_model(model: str | dict[str, Any] | Path | None, hardware: str | None, deployment: Deployment,
                         async_scheduling: bool, vllm_version: str | None = None) -> KernelSumCostModel:
    from sim.cost_models.aiconfigurator import AIConfiguratorKernels

    if model is None or hardware is None:
        raise ValueError("--cost-model aiconfigurator: needs --model and --hardware (h100, h200, b200, ...)")
    d = deployment
    shape = d.shape(model_shape(model))
    kernels = AIConfiguratorKernels(d.rank(shape), hardware, d.tensor_parallel_size, vllm_version,
                                    routing=d.routing_model())
    return KernelSumCostModel("aiconfigurator", kernels, shape, get_hardware(hardware, vllm_version), d,
                              async_scheduling)
