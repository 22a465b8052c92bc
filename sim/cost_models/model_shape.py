"""A dense decoder's shapes as the cost models see them: from a preset, a Hugging Face config dict, or a
`config.json` (the file, or a directory holding it): the simulator needs shapes, never weights.

Only dense Llama / Qwen2 / Qwen3 (and Mistral, a Llama) shapes are priced; anything else is refused in
one line rather than priced as if it were one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.model_shapes import MODEL_CONFIGS, check_model_config, read_config_json

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A dense decoder-only transformer (gated MLP, GQA attention). Under tensor parallelism
    `rank_shape` gives one GPU's shard in the same type."""

    name: str
    dtype: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    max_positions: int = 0
    model_type: str = ""

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "custom", dtype: str = "bfloat16") -> ModelShape:
        """Raises ValueError naming the field that is missing, of the wrong type or out of range."""
        cfg = cfg.get("text_config") or cfg
        if not isinstance(cfg, dict):
            raise ValueError(f"model config {name!r}: text_config must be an object")
        check_model_config(cfg, name)
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
        kind = cfg["model_type"]
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        return cls(name=name, dtype=dtype, hidden=h, num_layers=cfg["num_hidden_layers"], num_heads=nh,
                   num_kv_heads=nkv, head_dim=cfg.get("head_dim") or h // nh,
                   intermediate=cfg.get("intermediate_size") or 4 * h, vocab=cfg["vocab_size"],
                   tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=bool(cfg.get("attention_bias", kind == "qwen2")), qk_norm=kind == "qwen3",
                   max_positions=cfg.get("max_position_embeddings") or 0, model_type=kind)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def _layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_size, self.kv_size
        attn = 2 * h * q + 2 * h * kv + (q + 2 * kv) * self.qkv_bias + 2 * self.head_dim * self.qk_norm
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def non_embedding_params(self) -> int:
        return self.num_layers * self._layer_params + self.hidden

    @property
    def active_params(self) -> int:
        """Non-embedding weights each token multiplies through."""
        return self.non_embedding_params

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return self.non_embedding_params + self.head_params * (1 if self.tie_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def weight_read_bytes(self, num_tokens: int = 1) -> float:
        """Weights streamed by one forward: every layer and the LM head (the embedding is gathered by row)."""
        return (self.non_embedding_params + self.head_params) * self.dtype_bytes

    def describe(self) -> dict:
        return {**asdict(self), "total_params": self.total_params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token}


def rank_shape(shape: ModelShape, tp: int) -> ModelShape:
    """One GPU's shard under tensor parallelism, as vLLM splits it: attention heads and the MLP split
    evenly, KV heads split (or replicated, one per rank, when there are fewer than ranks), the
    vocabulary split with padding."""
    if tp < 1:
        raise ValueError(f"--tensor-parallel-size: must be >= 1, got {tp}")
    if tp == 1:
        return shape
    for what, n in (("attention heads", shape.num_heads), ("intermediate size", shape.intermediate)):
        if n % tp:
            raise ValueError(f"--tensor-parallel-size {tp}: {shape.name}'s {n} {what} do not split over {tp} GPUs")
    kv = shape.num_kv_heads
    if kv % tp and tp % kv:
        raise ValueError(f"--tensor-parallel-size {tp}: {shape.name}'s {kv} KV heads neither split over nor "
                         f"replicate across {tp} GPUs")
    return replace(shape, name=f"{shape.name} (1/{tp})", num_heads=shape.num_heads // tp,
                   num_kv_heads=max(1, kv // tp), intermediate=shape.intermediate // tp,
                   vocab=math.ceil(shape.vocab / tp))


def model_shape(model: str | dict[str, Any] | Path, dtype: str = "bfloat16") -> ModelShape:
    """A preset name or "builtin" (the engine's own shapes), a config.json file, a directory holding one
    (a checkpoint or just the config), or an HF config dict."""
    if isinstance(model, dict):
        return ModelShape.from_config(model, model.get("_name_or_path") or model.get("model_type") or "custom", dtype)
    key = str(model)
    if key.lower() in MODEL_CONFIGS:
        return ModelShape.from_config(MODEL_CONFIGS[key.lower()], key.lower(), dtype)
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        cfg = read_config_json(path)
        name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
        text = cfg.get("text_config") or cfg
        try:  # a bad field names the file it is in, not only the model's name
            check_model_config(text if isinstance(text, dict) else {}, str(name))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        return ModelShape.from_config(cfg, str(name), dtype)
    valid = ", ".join(sorted(MODEL_CONFIGS))
    raise ValueError(f"unknown model {key!r}; valid: {valid}, a config.json, a directory holding one, "
                     "or an HF config dict")
