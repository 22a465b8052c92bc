"""Model shapes as Hugging Face config dicts, in one torch-free place: the engine builds its presets and
built-in model from them, and the simulator's roofline cost model prices the same shapes.

Legacy `rope_theta`/`rope_scaling` keys are used because transformers 4.x and 5.x both accept them.
"""
from __future__ import annotations

import copy
from typing import Any

BUILTIN = "builtin"

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    # The built-in demo model (engine/builtin): a real Qwen3 architecture with our own 4096-token tokenizer.
    "builtin": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "initializer_range": 0.02,
        "dtype": "float32",
    },
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "hidden_act": "silu",
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
}
# Public model shapes a run can name with --model (dummy weights in the engine); the built-in model is not one.
PRESET_NAMES: tuple[str, ...] = tuple(name for name in MODEL_CONFIGS if name != BUILTIN)


def get_model_config(name: str) -> dict[str, Any]:
    """A fresh copy of the named config dict, safe for the caller to modify."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(sorted(PRESET_NAMES))}")
    return copy.deepcopy(MODEL_CONFIGS[name])
