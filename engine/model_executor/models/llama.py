"""One decoder for the Llama family: Llama 2/3.x, Qwen2/2.5 and Qwen3 differ only in a few flags.

Projections are merged (qkv, gate_up) so each layer runs two big matmuls instead of five;
`load_weights` splits HF's separate q/k/v and gate/up tensors into them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from engine.model_executor.layers import cpu_ops
from engine.model_executor.layers.activation import SiluAndMul
from engine.model_executor.layers.attention import Attention
from engine.model_executor.layers.layernorm import RMSNorm, rms_norm
from engine.model_executor.layers.rotary_embedding import RopeInputs, RotaryEmbedding, rope_params_from_config


def head_dim_of(config: Any) -> int:
    """`head_dim` from the config when present (Qwen3 decouples it from hidden/heads), else hidden/heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        attn_backend: str,
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=o_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, attn_backend, layer_idx=layer_idx
        )

    def forward(self, rope: RopeInputs, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        qk = self._native_qk(rope, qkv) if rope.cos_sin is None else None
        q, k = qk if qk is not None else self._qk(rope, qkv)
        return self.o_proj(self.attn(q, k, qkv[:, self.q_size + self.kv_size :]))

    def _native_qk(self, rope: RopeInputs, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """q and k normed and rotated in one pass by cpu_ops, or None where it does not take them."""
        q_weight, k_weight, eps = ((self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm
                                   else (None, None, 0.0))
        return cpu_ops.qk_norm_rope(qkv, self.num_heads, self.num_kv_heads, self.head_dim, self.rotary_emb.rotary_dim,
                                    self.rotary_emb.cos_sin_cache, rope.positions, q_weight, k_weight, eps)

    def _qk(self, rope: RopeInputs, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens, heads = qkv.shape[0], self.num_heads + self.num_kv_heads
        # q and k side by side as [T, q heads + kv heads, d]: one norm and one rotation serve both.
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, heads, self.head_dim)
        if self.qk_norm:
            weight = torch.cat([self.q_norm.weight.expand(self.num_heads, -1),
                                self.k_norm.weight.expand(self.num_kv_heads, -1)])
            qk = rms_norm(qk, weight, self.q_norm.eps)
        qk = self.rotary_emb.rotate(qk, rope.cos_sin or self.rotary_emb.cos_sin(rope.positions))
        return qk[:, : self.num_heads].flatten(1), qk[:, self.num_heads :].flatten(1)


# Rows per MLP pass on a CPU: a long prefill's [T, 2 * intermediate] activation does not fit in cache, and
# passes of this many rows keep it there. The result is the same to float32 rounding (a short last pass
# may be blocked differently by the GEMM).
CPU_MLP_ROWS = 512


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.shape[0] <= CPU_MLP_ROWS:
            return self._mlp(x)
        out = x.new_empty(*x.shape[:-1], self.down_proj.out_features)
        for rows_in, rows_out in zip(x.split(CPU_MLP_ROWS), out.split(CPU_MLP_ROWS)):
            rows_out.copy_(self._mlp(rows_in))
        return out

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


def dense_mlp(config: Any, layer_idx: int) -> nn.Module:
    """The feed-forward block of every Llama layer: one SwiGLU MLP of width `intermediate_size`."""
    return LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False))


# (config, layer index) -> that layer's feed-forward block, [T, H] -> [T, H]
MLPFactory = Callable[[Any, int], nn.Module]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        flags: dict,
        attn_backend: str,
        mlp_factory: MLPFactory = dense_mlp,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, rotary_emb, attn_backend=attn_backend, **flags)
        self.mlp = mlp_factory(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, rope: RopeInputs, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (mlp output, residual stream); the next norm adds them, saving a separate add."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rope, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: Any, flags: dict, attn_backend: str, mlp_factory: MLPFactory = dense_mlp) -> None:
        super().__init__()
        head_dim = head_dim_of(config)
        theta, scaling = rope_params_from_config(config)
        rotary_dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
        self.rotary_emb = RotaryEmbedding(head_dim, rotary_dim, config.max_position_embeddings, theta, scaling)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, self.rotary_emb, flags, attn_backend, mlp_factory)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        # Looked up once per forward, shared by every layer; cpu_ops' fused q/k kernel reads the cache itself.
        native = cpu_ops.usable(hidden)
        rope = RopeInputs(positions, None if native else self.rotary_emb.cos_sin(positions))
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Llama; subclasses only flip the flags below. Bias flags set to None follow `config.attention_bias`."""

    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norm: bool = False
    # checkpoint name -> (merged parameter, shard id)
    stacked_params: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    merged_shards: ClassVar[dict[str, set[str | int]]] = {"qkv_proj": {"q", "k", "v"}, "gate_up_proj": {0, 1}}

    def __init__(self, config: Any, attn_backend: str = "auto") -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}; only 'silu' is implemented")
        if getattr(config, "use_sliding_window", False):
            raise NotImplementedError("sliding-window attention is not supported")
        self.config = config
        attention_bias = bool(getattr(config, "attention_bias", False))
        flags = dict(
            qkv_bias=attention_bias if self.qkv_bias is None else self.qkv_bias,
            o_bias=attention_bias if self.o_bias is None else self.o_bias,
            qk_norm=self.qk_norm,
        )
        self.model = LlamaModel(config, flags, attn_backend, self.make_mlp)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        """Layer `layer_idx`'s feed-forward block; MoE models (models/moe.py) put sparse blocks in some layers."""
        return dense_mlp(config, layer_idx)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, H]; attention reads the forward context."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab], float32 so sampling is not done in bf16."""
        return self.lm_head(hidden).float()

    def attention_layers(self) -> list[Attention]:
        """In layer order, for the runner to bind one KV cache tensor per layer."""
        return [m for m in self.modules() if isinstance(m, Attention)]

    def shard_range(self, merged: str, shard: str | int) -> tuple[int, int]:
        """(start, rows) of checkpoint tensor `shard` inside merged parameter `merged`."""
        if merged == "qkv_proj":
            attn = self.attention_layers()[0]
            q_size, kv_size = attn.num_heads * attn.head_size, attn.num_kv_heads * attn.head_size
            ranges = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}
            if not isinstance(shard, str) or shard not in ranges:
                raise ValueError(f"qkv_proj has shards q, k and v, not {shard!r}")
            return ranges[shard]
        size = self.config.intermediate_size
        return int(shard) * size, size

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors in, cast to this model's dtype/device; returns the names of fully filled parameters."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        shards_seen: dict[str, set[str | int]] = {}
        for name, tensor in weights:
            if "rotary_emb." in name or (self.tie_word_embeddings and name.startswith("lm_head.")):
                continue
            parts = name.split(".")
            target, shard = name, None
            if len(parts) >= 2 and parts[-2] in self.stacked_params:
                merged, shard = self.stacked_params[parts[-2]]
                target = ".".join(parts[:-2] + [merged, parts[-1]])
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}")
            dest = params[target].data
            if shard is not None:
                dest = dest.narrow(0, *self.shard_range(merged, shard))
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"shape mismatch for {name!r}: checkpoint {tuple(tensor.shape)}, model {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            if shard is None:
                loaded.add(target)
            else:
                shards_seen.setdefault(target, set()).add(shard)
        # a merged parameter counts as loaded only once every one of its shards arrived
        loaded.update(t for t, seen in shards_seen.items() if seen == self.merged_shards[t.split(".")[-2]])
        return loaded
