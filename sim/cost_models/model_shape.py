"""A decoder's shapes as the cost models see them: from a preset, a Hugging Face config dict, or a
`config.json` (the file, or a directory holding it): the simulator needs shapes, never weights.

Dense Llama / Qwen2 / Qwen3 (and Mistral, a Llama) shapes, and the mixtures of experts Qwen3-MoE, Mixtral
and DeepSeek-V3 (multi-head latent attention, shared experts, leading dense layers) are priced; anything
else is refused in one line rather than priced as if it were one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.model_shapes import MODEL_CONFIGS, check_model_config, read_config_json
from sim.cost_models.routing import expected_activated

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
# vLLM's --kv-cache-dtype and --quantization values the simulator prices ("auto": the model's dtype).
KV_CACHE_DTYPES = ("auto", "fp8")
QUANTIZATIONS = (None, "fp8")


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
    # Mixture of experts (0: dense): routed experts held here (a rank's share under expert parallelism) of
    # `router_experts` in all, `top_k` per token, each `moe_intermediate` wide (a rank's slice under tensor
    # parallelism); shared experts' total width; the leading layers with a dense MLP instead.
    num_experts: int = 0
    router_experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    num_dense_layers: int = 0
    # Multi-head latent attention: one latent of kv_lora_rank + qk_rope_head_dim per token and layer is cached
    # (num_kv_heads 1, head_dim that size), not K and V per head; q_lora_rank 0 is a plain q projection.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    kv_dtype: str = ""  # the KV cache's dtype where it is not the weights' (--kv-cache-dtype fp8)
    quantization: str | None = None  # fp8: linear weights at one byte, the embedding and LM head as `dtype`

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "custom", dtype: str = "bfloat16") -> ModelShape:
        """Raises ValueError naming the field that is missing, of the wrong type or out of range."""
        cfg = cfg.get("text_config") or cfg
        if not isinstance(cfg, dict):
            raise ValueError(f"model config {name!r}: text_config must be an object")
        check_model_config(cfg, name, moe=True, mla=True)
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
        kind = cfg["model_type"]
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        layers = cfg["num_hidden_layers"]
        fields: dict[str, Any] = dict(
            name=name, dtype=dtype, hidden=h, num_layers=layers, num_heads=nh, num_kv_heads=nkv,
            head_dim=cfg.get("head_dim") or h // nh, intermediate=cfg.get("intermediate_size") or 4 * h,
            vocab=cfg["vocab_size"], tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", kind == "qwen2")), qk_norm=kind in ("qwen3", "qwen3_moe"),
            max_positions=cfg.get("max_position_embeddings") or 0, model_type=kind)
        experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
        if experts:
            fields.update(num_experts=experts, router_experts=experts, top_k=cfg["num_experts_per_tok"],
                          moe_intermediate=cfg.get("moe_intermediate_size") or fields["intermediate"])
        if kind == "qwen3_moe":
            step = cfg.get("decoder_sparse_step") or 1
            dense = set(cfg.get("mlp_only_layers") or ())
            fields["num_dense_layers"] = sum(1 for i in range(layers) if i in dense or (i + 1) % step)
        elif kind == "deepseek_v3":
            rope = cfg["qk_rope_head_dim"]
            fields.update(num_kv_heads=1, head_dim=cfg["qk_nope_head_dim"] + rope, kv_lora_rank=cfg["kv_lora_rank"],
                          qk_rope_head_dim=rope, q_lora_rank=cfg.get("q_lora_rank") or 0, v_head_dim=cfg["v_head_dim"],
                          qkv_bias=False,
                          num_dense_layers=min(cfg.get("first_k_dense_replace") or 0, layers),
                          shared_intermediate=(cfg.get("n_shared_experts") or 0) * fields["moe_intermediate"])
        return cls(**fields)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Elements one token caches per layer and per K or V (MLA: its one latent)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def _attention_params(self) -> int:
        h, q, kv = self.hidden, self.q_size, self.kv_size
        if self.is_mla:
            nh, r = self.num_heads, self.kv_lora_rank
            q_proj = h * self.q_lora_rank + self.q_lora_rank * q if self.q_lora_rank else h * q
            nope = self.head_dim - self.qk_rope_head_dim
            return q_proj + h * kv + r * nh * (nope + self.v_head_dim) + nh * self.v_head_dim * h
        return 2 * h * q + 2 * h * kv + (q + 2 * kv) * self.qkv_bias + 2 * self.head_dim * self.qk_norm

    @property
    def expert_params(self) -> int:
        """One routed expert's weights (gate, up and down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def _moe_layer_mlp(self) -> int:
        """A sparse layer's router, routed experts held here and shared experts."""
        h = self.hidden
        return h * self.router_experts + self.num_experts * self.expert_params + 3 * h * self.shared_intermediate

    @property
    def _linear_params(self) -> int:
        """Weights of every layer's linear layers (what fp8 quantization stores at one byte)."""
        dense_mlp = 3 * self.hidden * self.intermediate
        mlps = (self.num_layers - self.num_moe_layers) * dense_mlp + self.num_moe_layers * self._moe_layer_mlp
        return self.num_layers * self._attention_params + mlps

    @property
    def non_embedding_params(self) -> int:
        return self._linear_params + self.num_layers * 2 * self.hidden + self.hidden

    @property
    def active_params(self) -> int:
        """Non-embedding weights each token multiplies through (top_k routed experts, not all)."""
        idle = self.num_moe_layers * (self.num_experts - min(self.top_k, self.num_experts)) * self.expert_params
        return self.non_embedding_params - idle

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return self.non_embedding_params + self.head_params * (1 if self.tie_embeddings else 2)

    @property
    def weight_dtype_bytes(self) -> int:
        """Bytes per weight of the linear layers: one under fp8 quantization."""
        return 1 if self.quantization == "fp8" else self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        embeddings = self.head_params * (1 if self.tie_embeddings else 2)
        rest = self.non_embedding_params - self._linear_params
        return self._linear_params * self.weight_dtype_bytes + (embeddings + rest) * self.dtype_bytes

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype] if self.kv_dtype else self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, or MLA's one latent per layer, at the KV cache's dtype."""
        return (1 if self.is_mla else 2) * self.num_layers * self.kv_size * self.kv_dtype_bytes

    def weight_read_bytes(self, num_tokens: int = 1) -> float:
        """Weights streamed by one forward: every layer and the LM head (the embedding is gathered by row);
        a sparse layer reads only the experts its tokens activate (every one held, past a few tokens)."""
        idle = 0.0
        if self.is_moe:
            held = self.num_experts
            touched = expected_activated(num_tokens, self.router_experts, self.top_k) * held / self.router_experts
            idle = self.num_moe_layers * (held - touched) * self.expert_params
        return (self._linear_params - idle) * self.weight_dtype_bytes + (
            self.non_embedding_params - self._linear_params + self.head_params) * self.dtype_bytes

    def describe(self) -> dict:
        return {**asdict(self), "total_params": self.total_params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token}


def rank_shape(shape: ModelShape, tp: int, dp: int = 1, expert_parallel: bool = False) -> ModelShape:
    """One GPU's shard as vLLM lays the model out: attention, dense MLPs and shared experts split over the
    `tp` ranks of its data-parallel rank (KV heads split, or replicated one per rank when fewer; MLA's
    latent replicated; the vocabulary split with padding), and the routed experts over all dp x tp ranks:
    whole experts divided among them under expert parallelism, else each expert's width split
    (vLLM's FusedMoEParallelConfig)."""
    if tp < 1:
        raise ValueError(f"--tensor-parallel-size: must be >= 1, got {tp}")
    if dp < 1:
        raise ValueError(f"--data-parallel-size: must be >= 1, got {dp}")
    moe_ranks = tp * dp if shape.is_moe else 1
    if tp == 1 and moe_ranks == 1:
        return shape
    for what, n in (("attention heads", shape.num_heads), ("intermediate size", shape.intermediate),
                    ("shared experts' width", shape.shared_intermediate)):
        if n % tp:
            raise ValueError(f"--tensor-parallel-size {tp}: {shape.name}'s {n} {what} do not split over {tp} GPUs")
    kv = shape.num_kv_heads
    if kv % tp and tp % kv:
        raise ValueError(f"--tensor-parallel-size {tp}: {shape.name}'s {kv} KV heads neither split over nor "
                         f"replicate across {tp} GPUs")
    experts, width = shape.num_experts, shape.moe_intermediate
    if expert_parallel and experts % moe_ranks:
        raise ValueError(f"--enable-expert-parallel: {shape.name}'s {experts} experts do not split over "
                         f"{moe_ranks} GPUs (data parallel x tensor parallel)")
    if not expert_parallel and width % moe_ranks:
        raise ValueError(f"{shape.name}'s experts {width} wide do not split over {moe_ranks} GPUs (data parallel x "
                         "tensor parallel): pass --enable-expert-parallel")
    experts, width = (experts // moe_ranks, width) if expert_parallel else (experts, width // moe_ranks)
    split = f"1/{tp}" + (f", experts 1/{moe_ranks}" if moe_ranks > 1 else "")
    return replace(shape, name=f"{shape.name} ({split})", num_heads=shape.num_heads // tp,
                   num_kv_heads=max(1, kv // tp), intermediate=shape.intermediate // tp,
                   shared_intermediate=shape.shared_intermediate // tp, num_experts=experts, moe_intermediate=width,
                   vocab=math.ceil(shape.vocab / tp))


def with_dtypes(shape: ModelShape, kv_cache_dtype: str = "auto", quantization: str | None = None) -> ModelShape:
    """The shape with vLLM's --kv-cache-dtype and --quantization applied (fp8: one byte a value)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization: must be fp8 or none, got {quantization!r}")
    return replace(shape, kv_dtype="float8" if kv_cache_dtype == "fp8" else "", quantization=quantization)


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
            check_model_config(text if isinstance(text, dict) else {}, str(name), moe=True, mla=True)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        return ModelShape.from_config(cfg, str(name), dtype)
    valid = ", ".join(sorted(MODEL_CONFIGS))
    raise ValueError(f"unknown model {key!r}; valid: {valid}, a config.json, a directory holding one, "
                     "or an HF config dict")
