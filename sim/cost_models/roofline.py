"""Analytic step time from a model's shape and an accelerator's peaks: a step is either compute-bound
(matmul FLOPs) or memory-bound (weights plus KV cache streamed once), whichever takes longer, plus
host overheads. No measurement needed, so it can price hardware nobody has run on yet."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.model_shapes import MODEL_CONFIGS
from sim.batch import StepBatch
from sim.cost_models.hardware import CALIBRATION_ONLY, Hardware, get_hardware, hardware_names

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1}
# What a CUDA process holds besides weights, KV cache and activations (context, allocator slack).
RUNTIME_RESERVE_BYTES = 512 << 20
# The engine's KV cache size on CPU when nothing else says (its --kv-cache-memory default).
CPU_KV_CACHE_MEMORY = 512 << 20


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer (gated MLP, GQA attention, optional MoE) as a cost model sees it."""

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
    num_experts: int = 0
    experts_per_token: int = 0
    max_positions: int = 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "custom", dtype: str = "bfloat16") -> ModelShape:
        cfg = cfg.get("text_config") or cfg
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in cfg]
        if missing:
            raise ValueError(f"model config {name!r}: missing {', '.join(missing)}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
        h, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
        mlp = cfg.get("moe_intermediate_size") if experts else None
        kind = cfg.get("model_type", "")
        return cls(name=name, dtype=dtype, hidden=h, num_layers=int(cfg["num_hidden_layers"]), num_heads=nh,
                   num_kv_heads=int(cfg.get("num_key_value_heads") or nh), head_dim=int(cfg.get("head_dim") or h // nh),
                   intermediate=int(mlp or cfg.get("intermediate_size") or 4 * h), vocab=int(cfg["vocab_size"]),
                   tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   qkv_bias=bool(cfg.get("attention_bias", kind == "qwen2")), qk_norm=kind.startswith("qwen3"),
                   num_experts=experts, experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
                   max_positions=int(cfg.get("max_position_embeddings") or 0))

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def _attn_params(self) -> int:
        h, q, kv = self.hidden, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return 2 * h * q + 2 * h * kv + (q + 2 * kv) * self.qkv_bias + 2 * self.head_dim * self.qk_norm + 2 * h

    @property
    def _expert_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def _layer_params(self, experts: float) -> float:
        """One layer's weights with `experts` gated MLPs (dense models have exactly one)."""
        router = self.hidden * self.num_experts
        return self._attn_params + router + experts * self._expert_params

    @property
    def non_embedding_params(self) -> int:
        return int(self.num_layers * self._layer_params(self.num_experts or 1) + self.hidden)

    @property
    def active_params(self) -> int:
        """Non-embedding weights each token multiplies through (MoE: only its routed experts)."""
        return int(self.num_layers * self._layer_params(self.experts_per_token or 1) + self.hidden)

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

    def weight_read_bytes(self, num_tokens: int) -> float:
        """Weights streamed by one forward: every layer, the LM head, and (MoE) each expert some token hit;
        the embedding table is only gathered row by row, so it is left out."""
        experts = min(self.num_experts, self.experts_per_token * num_tokens) if self.num_experts else 1
        return (self.num_layers * self._layer_params(experts) + self.hidden + self.head_params) * self.dtype_bytes

    def flops(self, batch: StepBatch) -> float:
        """Matmul FLOPs: 2 per weight per token, the LM head on each sequence's last row, and attention
        (QK^T and PV, 4 * heads * head_dim per query-key pair). Pairs are the causal prefill pairs plus
        one row over the whole context per sequence: exact for decodes, one row too many per prefill chunk."""
        pairs = batch.prefill_attention + batch.context_tokens
        return (2.0 * self.active_params * batch.num_tokens + 2.0 * self.head_params * batch.num_seqs
                + 4.0 * self.num_layers * self.num_heads * self.head_dim * pairs)

    def bytes_moved(self, batch: StepBatch) -> float:
        """Weights once, the KV of every attended context token read, the new tokens' KV written."""
        kv = self.kv_bytes_per_token * (batch.context_tokens + batch.num_tokens)
        return self.weight_read_bytes(batch.num_tokens) + kv

    def describe(self) -> dict:
        return {**asdict(self), "total_params": self.total_params, "active_params": self.active_params,
                "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token}


def model_shape(model: str | dict[str, Any] | Path, dtype: str = "bfloat16") -> ModelShape:
    """A preset name or "builtin" (the engine's own shapes), a checkpoint directory (its config.json) or
    an HF config dict."""
    if isinstance(model, dict):
        return ModelShape.from_config(model, model.get("_name_or_path") or model.get("model_type") or "custom", dtype)
    key = str(model)
    if key.lower() in MODEL_CONFIGS:
        return ModelShape.from_config(MODEL_CONFIGS[key.lower()], key.lower(), dtype)
    path = Path(key) / "config.json"
    if path.is_file():
        return ModelShape.from_config(json.loads(path.read_text()), key, dtype)
    valid = ", ".join(sorted(MODEL_CONFIGS))
    raise ValueError(f"unknown model {key!r}; valid: {valid}, a checkpoint directory or an HF config dict")


def effective_from_coefficients(coef: dict[str, float], shape: ModelShape) -> dict[str, Any]:
    """Measured FLOP/s and bandwidth implied by a calibrated fit on `shape`. Every fitted cost is at
    least its physical part (a prefill token's 2 FLOPs per active weight, a decode token's plus the LM
    head, a context token's KV bytes, the fixed cost's weight read), so each gives a lower bound on
    the device's rate; the tightest (largest) bound is taken, and what c0 leaves over is overhead."""
    flops = {"c_p": 2.0 * shape.active_params / coef["c_p"] if coef["c_p"] > 0 else 0.0,
             "c_d": 2.0 * (shape.active_params + shape.head_params) / coef["c_d"] if coef["c_d"] > 0 else 0.0}
    weights = shape.weight_read_bytes(1)
    bandwidth = {"c_ctx": shape.kv_bytes_per_token / coef["c_ctx"] if coef["c_ctx"] > 0 else 0.0,
                 "c0": weights / coef["c0"] if coef["c0"] > 0 else 0.0}
    flops_from, bw_from = max(flops, key=flops.get), max(bandwidth, key=bandwidth.get)
    if not flops[flops_from]:
        raise ValueError("the fit has no per-token cost (c_p = c_d = 0): effective FLOP/s cannot be derived")
    if not bandwidth[bw_from]:
        raise ValueError("the fit has no fixed or context cost (c0 = c_ctx = 0): bandwidth cannot be derived")
    bw = bandwidth[bw_from]
    return {"flops": flops[flops_from], "bandwidth": bw, "step_overhead": max(coef["c0"] - weights / bw, 0.0),
            "seq_overhead": coef["c_seq"], "flops_from": flops_from, "bandwidth_from": bw_from,
            "flops_bounds": flops, "bandwidth_bounds": bandwidth, "model": shape.name, "dtype": shape.dtype}


class RooflineCostModel:
    """time = max(FLOPs / effective FLOP/s, bytes / effective bandwidth) + step + per-sequence overhead."""

    name = "roofline"

    def __init__(self, shape: ModelShape, hardware: Hardware, source: str = "spec sheet",
                 kv_cache_memory: int | None = None) -> None:
        self.shape = shape
        self.hardware = hardware
        self.source = source
        self.kv_cache_memory = kv_cache_memory
        self._constants: tuple = (None, None)

    @property
    def max_model_len(self) -> int | None:
        """The model's context length: the simulator's default --max-model-len for workload runs."""
        return self.shape.max_positions or None

    @classmethod
    def from_args(cls, model: str | dict[str, Any] | None = None, hardware: str | None = None,
                  profile: str | Path | None = None, dtype: str | None = None) -> RooflineCostModel:
        """Spec-sheet hardware by name, or measured FLOP/s and bandwidth from a calibration profile
        (then `model` defaults to the profiled model, and a table `hardware` only supplies memory size)."""
        if profile is None:
            if hardware is None:
                raise ValueError(f"roofline cost model: needs a hardware name; valid: {', '.join(hardware_names())}")
            if model is None:
                raise ValueError("roofline cost model: needs a model (preset name, checkpoint dir or HF config)")
            return cls(model_shape(model, dtype or "bfloat16"), get_hardware(hardware))
        from sim.cost_models.calibrated import load_profile

        prof = load_profile(profile)
        ident = prof.get("model") or {}
        prof_dtype = ident.get("dtype") if ident.get("dtype") in DTYPE_BYTES else "bfloat16"
        if not ident.get("hf_config"):
            raise ValueError(f"{profile}: model.hf_config: missing, so effective FLOP/s cannot be derived")
        measured = effective_from_coefficients(prof["coefficients"],
                                               model_shape(ident["hf_config"], prof_dtype))
        base = get_hardware(hardware) if hardware and hardware.lower() not in CALIBRATION_ONLY else None
        device = prof.get("device") or {}
        name = base.name if base else f"{device.get('type', 'cpu')} (calibrated)"
        hw = Hardware(name, measured["flops"], measured["bandwidth"],
                      base.memory_bytes if base else device.get("memory_bytes"), mfu_eff=1.0, bw_eff=1.0,
                      step_overhead=measured["step_overhead"], seq_overhead=measured["seq_overhead"],
                      note=f"measured on {device.get('name', '?')} from {profile}")
        # Without a memory size (a CPU), the KV cache gets what the calibration run gave it.
        kv = prof.get("kv_cache") or {}
        kv_memory = None
        if hw.memory_bytes is None and kv.get("num_blocks") and kv.get("bytes_per_block"):
            kv_memory = int(kv["num_blocks"]) * int(kv["bytes_per_block"])
        shape = model_shape(ident["hf_config"] if model is None else model, dtype or prof_dtype)
        if model is None:
            shape = replace(shape, name=ident.get("model") or shape.name)
        return cls(shape, hw, f"calibration profile {profile}", kv_memory)

    def breakdown(self, batch: StepBatch) -> dict[str, Any]:
        """Where the step's time goes: FLOPs, bytes, both roofline legs, overheads and which leg binds."""
        hw, shape = self.hardware, self.shape
        overhead = hw.step_overhead + hw.seq_overhead * batch.num_seqs
        if batch.num_tokens == 0:
            return {"flops": 0.0, "bytes": 0.0, "compute_s": 0.0, "memory_s": 0.0, "overhead_s": hw.step_overhead,
                    "bound": "idle", "time_s": hw.step_overhead}
        flops, nbytes = shape.flops(batch), shape.bytes_moved(batch)
        compute, memory = flops / hw.effective_flops, nbytes / hw.effective_bandwidth
        return {"flops": flops, "bytes": nbytes, "compute_s": compute, "memory_s": memory, "overhead_s": overhead,
                "bound": "compute" if compute >= memory else "memory", "time_s": max(compute, memory) + overhead}

    def step_time(self, batch: StepBatch, step: int) -> float:
        """`breakdown(batch)["time_s"]`, with the per-model constants of `flops` and `bytes_moved` taken
        once (this runs once per simulated step); the same operations in the same order, so the same bits."""
        hw, shape = self.hardware, self.shape
        num_tokens = batch.num_prefill_tokens + batch.num_decode_tokens  # batch.num_tokens, no property call
        if num_tokens == 0:
            return hw.step_overhead
        c = self._constants
        if c[0] is not shape or c[1] is not hw:
            c = self._constants = self._derive_constants()
        _, _, per_token, per_seq, per_pair, eff_flops, weights, kv_per_token, eff_bw = c
        num_seqs = batch.num_prefill_seqs + batch.num_decode_seqs
        compute = (per_token * num_tokens + per_seq * num_seqs
                   + per_pair * (batch.prefill_attention + batch.context_tokens)) / eff_flops
        moved = (weights if weights is not None else shape.weight_read_bytes(num_tokens))
        memory = (moved + kv_per_token * (batch.context_tokens + num_tokens)) / eff_bw
        return (compute if compute >= memory else memory) + hw.step_overhead + hw.seq_overhead * num_seqs

    def decode_step_times(self, num_seqs: int, context_tokens: int, count: int) -> list[float]:
        """`step_time` of `count` consecutive decode-only steps of `num_seqs` requests, the first reading
        `context_tokens` of context and each next one `num_seqs` more: a decode run (sim.decode_runs)
        times its steps in one call, with no StepBatch per step. The operations of `step_time` in its
        order (what does not change from step to step taken once), so the same bits."""
        hw, shape = self.hardware, self.shape
        c = self._constants
        if c[0] is not shape or c[1] is not hw:
            c = self._constants = self._derive_constants()
        _, _, per_token, per_seq, per_pair, eff_flops, weights, kv_per_token, eff_bw = c
        n = num_seqs
        fixed_flops = per_token * n + per_seq * n
        moved = weights if weights is not None else shape.weight_read_bytes(n)
        step_overhead, seq_overhead = hw.step_overhead, hw.seq_overhead * n
        times = []
        for context in range(context_tokens, context_tokens + n * count, n):
            compute = (fixed_flops + per_pair * context) / eff_flops
            memory = (moved + kv_per_token * (context + n)) / eff_bw
            times.append((compute if compute >= memory else memory) + step_overhead + seq_overhead)
        return times

    def _derive_constants(self) -> tuple:
        """(shape, hardware, then the factors of ModelShape.flops / bytes_moved); the weight bytes only
        for a dense model, where they do not depend on the batch."""
        shape, hw = self.shape, self.hardware
        weights = shape.weight_read_bytes(1) if not shape.num_experts else None
        return (shape, hw, 2.0 * shape.active_params, 2.0 * shape.head_params,
                4.0 * shape.num_layers * shape.num_heads * shape.head_dim, hw.effective_flops, weights,
                shape.kv_bytes_per_token, hw.effective_bandwidth)

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int:
        """KV blocks (null block included, as the engine's num_gpu_blocks) that fit in the device's memory
        share after weights, a rough activation peak for one full step, and the runtime's own reserve."""
        shape = self.shape
        if kv_cache_memory is None:
            kv_cache_memory = self.kv_cache_memory
        if kv_cache_memory is None and self.hardware.memory_bytes is None:
            kv_cache_memory = CPU_KV_CACHE_MEMORY
        if kv_cache_memory is not None:
            available = float(kv_cache_memory)
        else:
            mlp = shape.intermediate * max(shape.experts_per_token, 1)
            activations = max_num_batched_tokens * (4 * shape.hidden + 2 * mlp) * shape.dtype_bytes
            available = (self.hardware.memory_bytes * gpu_memory_utilization - shape.weight_bytes - activations
                         - RUNTIME_RESERVE_BYTES)
        blocks = int(available // (block_size * shape.kv_bytes_per_token))
        if blocks < 2:
            raise ValueError(f"model {shape.name} ({shape.weight_bytes / 1e9:.1f} GB of {shape.dtype} weights) leaves "
                             f"no room for a KV cache on {self.hardware.name} at gpu_memory_utilization "
                             f"{gpu_memory_utilization}")
        return blocks

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "model": self.shape.describe(),
                "hardware": self.hardware.to_dict(), "effective_flops": self.hardware.effective_flops,
                "effective_bandwidth": self.hardware.effective_bandwidth, "kv_cache_memory": self.kv_cache_memory}
