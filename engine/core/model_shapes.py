"""Model shapes as Hugging Face config dicts, in one torch-free place: the engine builds its presets and
built-in model from them, and the simulator's roofline cost model prices the same shapes.

Legacy `rope_theta`/`rope_scaling` keys are used because transformers 4.x and 5.x both accept them.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from engine.core.bounded_read import read_mapping

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
    # Qwen3-30B-A3B-Instruct-2507: every layer a sparse MoE block, as its config.json says.
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "rope_theta": 10000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "hidden_act": "silu",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
}
# Public model shapes a run can name with --model (dummy weights in the engine); the built-in model is not one.
PRESET_NAMES: tuple[str, ...] = tuple(name for name in MODEL_CONFIGS if name != BUILTIN)


def get_model_config(name: str) -> dict[str, Any]:
    """A fresh copy of the named config dict, safe for the caller to modify."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(sorted(PRESET_NAMES))}")
    return copy.deepcopy(MODEL_CONFIGS[name])


DENSE_TYPES = ("llama", "qwen2", "qwen3", "mistral")
MOE_TYPES = ("qwen3_moe", "mixtral")
MLA_TYPES = ("deepseek_v3",)  # the cost models price it (latent KV, shared experts); the engine does not run it
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_POSITIVE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_OPTIONAL_POSITIVE = ("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")
# The largest each size may be: many times today's largest dense models, yet small enough that weight and KV
# sizes, and their products with token counts, stay exact int64 and finite float64.
MAX_SIZES = {
    "hidden_size": 1 << 20, "num_hidden_layers": 4096, "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14,
    "head_dim": 1 << 14, "intermediate_size": 1 << 22, "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 30,  # a position table, not an allocation: room for any context length
}
MAX_PARAMS = 1 << 45  # weights of one model: some 35 trillion, far past any dense model built


def check_model_config(cfg: dict[str, Any], name: str, moe: bool = False, mla: bool = False) -> None:
    """The shape fields the engine and the cost models rely on, checked once for both: a dense
    Llama/Qwen2/Qwen3 (or Mistral) model type; where `moe` a Qwen3-MoE or Mixtral one, where `mla` (the
    cost models) DeepSeek-V3; positive integer sizes, KV heads that divide the heads, top-k within the
    experts. Raises ValueError naming the config and the field."""
    kind = str(cfg.get("model_type") or "")
    # Qwen3-MoE's config.json says num_experts (transformers 5 writes num_local_experts, as Mixtral's does).
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if not (kind in DENSE_TYPES and not experts or moe and kind in MOE_TYPES or mla and kind in MLA_TYPES):
        kinds = [*(MOE_TYPES if moe else ()), *(MLA_TYPES if mla else ())]
        what = f"dense {', '.join(DENSE_TYPES)} shapes" + (f" and {', '.join(kinds)} ones" if kinds else "")
        raise ValueError(f"model config {name!r}: model_type {kind or 'missing'!r} is not supported; {what} are")
    if kind in MOE_TYPES or kind in MLA_TYPES:
        top_k = cfg.get("num_experts_per_tok")
        key = "n_routed_experts" if kind in MLA_TYPES else "num_experts"
        for field, value in ((key, experts), ("num_experts_per_tok", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model config {name!r}: {field} must be a positive integer, got {value!r}")
        if isinstance(top_k, int) and isinstance(experts, int) and top_k > experts:
            raise ValueError(f"model config {name!r}: num_experts_per_tok {top_k} is more than the {experts} experts")
    if kind in MLA_TYPES:
        for field in _MLA_FIELDS:
            value = cfg.get(field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > MAX_SIZES["head_dim"]:
                raise ValueError(f"model config {name!r}: {field} must be a positive integer up to "
                                 f"{MAX_SIZES['head_dim']}, got {value!r}")
    missing = [k for k in _POSITIVE if k not in cfg]
    if missing:
        raise ValueError(f"model config {name!r}: missing {', '.join(missing)}")
    for key in (*_POSITIVE, *(k for k in _OPTIONAL_POSITIVE if cfg.get(k) is not None)):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"model config {name!r}: {key} must be a positive integer, got {value!r}")
        if value > MAX_SIZES[key]:
            raise ValueError(f"model config {name!r}: {key} {value} is more than {MAX_SIZES[key]:,}, past any model")
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    if nh % nkv:
        raise ValueError(f"model config {name!r}: num_attention_heads {nh} is not a multiple of "
                         f"num_key_value_heads {nkv}")
    if not cfg.get("head_dim") and h % nh:
        raise ValueError(f"model config {name!r}: hidden_size {h} does not split into {nh} heads (give head_dim)")
    params = weight_count(cfg)
    if params > MAX_PARAMS:
        raise ValueError(f"model config {name!r}: num_hidden_layers, hidden_size, intermediate_size and vocab_size "
                         f"make {params:.3g} weights, more than {MAX_PARAMS:.3g}, past any model")


def weight_count(cfg: dict[str, Any]) -> int:
    """About how many weights the shape holds (attention, gated MLPs or every expert with its router,
    embedding and head), in exact ints."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    inter = cfg.get("intermediate_size") or 4 * h
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    width = cfg.get("moe_intermediate_size") or inter  # Mixtral's experts are intermediate_size wide
    mlp = experts * (3 * h * width + h) if experts else 3 * h * inter
    layer = 2 * h * nh * hd + 2 * h * nkv * hd + mlp
    return cfg["num_hidden_layers"] * layer + 2 * cfg["vocab_size"] * h


MAX_CONFIG_BYTES = 1 << 20


def read_config_json(path: Path) -> dict[str, Any]:
    """A config.json read with a size cap; one-line ValueError naming the file otherwise."""
    return read_mapping(path, MAX_CONFIG_BYTES, "model config")
