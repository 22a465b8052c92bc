"""Architecture name (HF `architectures[0]`) -> model class, imported lazily."""
from __future__ import annotations

import importlib
from typing import Any

from engine.model_executor.models.llama import LlamaForCausalLM

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
}
# Configs built from a dict may lack `architectures`; their model_type still names the family.
_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[LlamaForCausalLM]:
    """Every architecture served is a variant of the one Llama-family decoder (models/llama.py)."""
    if architecture not in _MODELS:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
        )
    module, name = _MODELS[architecture]
    cls = getattr(importlib.import_module(f"engine.model_executor.models.{module}"), name)
    if not (isinstance(cls, type) and issubclass(cls, LlamaForCausalLM)):
        raise TypeError(f"engine.model_executor.models.{module}.{name} is not a LlamaForCausalLM")
    return cls


def resolve_architecture(hf_config: Any) -> str:
    """The architecture a config asks for: its first `architectures` entry, else one inferred from model_type."""
    archs = getattr(hf_config, "architectures", None)
    if archs:
        return archs[0]
    model_type = getattr(hf_config, "model_type", None)
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    raise ValueError(
        f"config names no architecture and model_type {model_type!r} is unknown; "
        f"supported: {', '.join(supported_architectures())}"
    )
