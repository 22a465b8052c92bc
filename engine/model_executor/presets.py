"""Public model shapes with dummy weights, for benchmarks without downloading checkpoints. The shapes
themselves live in engine.core.model_shapes, which the simulator reads too."""
from __future__ import annotations

from typing import Any

from engine.core.model_shapes import MODEL_CONFIGS, PRESET_NAMES, get_model_config

PRESETS: dict[str, dict[str, Any]] = {name: MODEL_CONFIGS[name] for name in PRESET_NAMES}


def get_preset(name: str) -> dict[str, Any]:
    """A fresh copy of the named shape, safe for the caller to modify."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    return get_model_config(name)


def hf_config_from_dict(config: dict[str, Any]) -> Any:
    """A transformers config object of the dict's model_type, as AutoConfig would load it from disk."""
    from transformers import AutoConfig

    fields = dict(config)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)
