"""The per-kernel roofline: each kernel of a step (sim.cost_models.kernels) bound on its own, by its
FLOPs at the family's fitted share of peak or by its bytes at the fitted share of bandwidth, plus the
kernel's floor (launch and tail), and the kernels summed. It prices GPUs nobody has profiled; the
efficiencies come from measured kernels of the same GPU family (sim.cost_models.hardware).

A calibration profile (`sim calibrate` on engine traces) gives measured FLOP/s and bandwidth instead
(the CPU has no datasheet): then efficiencies are 1 and floors 0, since the fit already includes them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.cost_models.base import CostModelInfo, DecodeStepTimes, StepTiming
from sim.cost_models.batch import StepBatch, causal_pairs
from sim.cost_models.deployment import Deployment
from sim.cost_models.hardware import CALIBRATION_ONLY, Hardware, get_hardware, hardware_names
from sim.cost_models.kernels import AttentionShape, KernelSumCostModel, MoeCall, kv_blocks, mean_context
from sim.cost_models.model_shape import DTYPE_BYTES, ModelShape, model_shape

__all__ = ["DTYPE_BYTES", "ModelShape", "RooflineCostModel", "RooflineKernels", "effective_from_coefficients",
           "model_shape"]
# The engine's KV cache size on CPU when nothing else says (its --kv-cache-memory default).
CPU_KV_CACHE_MEMORY = 512 << 20
# Bytes per logit the sampler reads (float32), and how many passes over the logits it makes.
_LOGIT_BYTES, _SAMPLER_PASSES = 4, 2


class RooflineKernels:
    """`KernelTimes` from one rank's shapes and a GPU's peaks and efficiencies; no grid, so nothing is
    ever outside it, and attention depends on the total context alone (no skew)."""

    outside = 0

    def __init__(self, rank: ModelShape, hardware: Hardware) -> None:
        self.rank = rank
        self.hw = hardware
        self.source = f"roofline on {hardware.name}"
        self._flops = hardware.peak_flops * hardware.mfu_eff
        self._attn_flops = hardware.peak_flops * hardware.attn_eff
        self._bw = hardware.hbm_bandwidth * hardware.bw_eff
        self._pointwise_bw = hardware.hbm_bandwidth * hardware.pointwise_eff
        s, b = rank, rank.dtype_bytes
        self._gemms = {"qkv_proj": (s.q_size + 2 * s.kv_size, s.hidden), "o_proj": (s.hidden, s.q_size),
                       "gate_up_proj": (2 * s.intermediate, s.hidden), "down_proj": (s.hidden, s.intermediate)}
        # Bytes per token of the pointwise kernels: read and write, the norms' fused residual add included.
        self._pointwise = {"layernorm": 4 * s.hidden * b, "final_layernorm": 2 * s.hidden * b,
                           "embedding": 2 * s.hidden * b, "rotary_emb": 2 * (s.q_size + s.kv_size) * b,
                           "qk_norm": 2 * (s.q_size + s.kv_size) * b, "act_fn": 3 * s.intermediate * b}
        if s.is_mla:  # q (latent absorbed), the latent's down-projection, and the output projection
            self._gemms["qkv_proj"] = (s.q_size + s.kv_size, s.hidden)
            self._gemms["o_proj"] = (s.hidden, s.num_heads * s.v_head_dim)
        kv_b = s.kv_dtype_bytes
        self._kv_bytes = (1 if s.is_mla else 2) * s.kv_size * kv_b  # one token's K and V (MLA: latent) in one layer
        self._q_bytes = s.q_size * b  # one token's queries in one layer
        # QK^T and PV of one query-key pair (MLA absorbed: scores over the latent and rope part, values the latent)
        self._pair_flops = (2.0 * s.num_heads * (s.kv_size + s.kv_lora_rank) if s.is_mla
                            else 4.0 * s.num_heads * s.head_dim)
        self._weight_bytes = s.weight_dtype_bytes
        self._flops_rate = self._flops * (hardware.fp8_speedup if s.quantization == "fp8" else 1.0)
        self._attn_half, self._attn_floor = hardware.attn_half, hardware.attn_floor

    def _kernel(self, flops: float, nbytes: float) -> float:
        compute, memory = flops / self._flops, nbytes / self._bw
        return self.hw.kernel_floor + (compute if compute > memory else memory)

    def _pointwise_kernel(self, nbytes: float) -> float:
        return self.hw.kernel_floor + nbytes / self._pointwise_bw

    def _gemm(self, m: float, n: int, k: int) -> float:
        """An (m x k) by (k x n) product: weights at their stored width (fp8: one byte, at the FP8 peak)."""
        b = self.rank.dtype_bytes
        flops, nbytes = 2.0 * m * n * k, n * k * self._weight_bytes + (m * k + m * n) * b
        compute, memory = flops / self._flops_rate, nbytes / self._bw
        return self.hw.kernel_floor + (compute if compute > memory else memory)

    def moe(self, call: MoeCall) -> float:
        """The router GEMM, then gate_up, activation and down over the routed pairs: each activated expert's
        weights read once, FLOPs from the pairs this rank computes; shared experts as a dense MLP."""
        s = self.rank
        h, width, b = s.hidden, s.moe_intermediate, s.dtype_bytes
        pairs = call.tokens * s.top_k * call.share
        time = self._gemm(call.tokens, s.router_experts, h)
        weights = call.activated * 3 * h * width * self._weight_bytes
        flops = 2.0 * pairs * 3 * h * width
        compute, memory = flops / self._flops_rate, (weights + pairs * (2 * h + 3 * width) * b) / self._bw
        time += 3 * self.hw.kernel_floor + (compute if compute > memory else memory)
        if s.shared_intermediate:
            time += self._gemm(call.tokens, 2 * s.shared_intermediate, h) + self._gemm(call.tokens, h, s.shared_intermediate)
            time += self._pointwise_kernel(call.tokens * 3 * s.shared_intermediate * b)
        return time

    def dense(self, op: str, tokens: int) -> float:
        if op in self._gemms:
            return self._gemm(tokens, *self._gemms[op])
        return self._pointwise_kernel(tokens * self._pointwise[op])

    def per_sequence(self, op: str, sequences: int) -> float:
        if op == "lm_head":
            return self._gemm(sequences, self.rank.vocab, self.rank.hidden)
        return self._pointwise_kernel(sequences * self.rank.vocab * _LOGIT_BYTES * _SAMPLER_PASSES)

    def attention(self, shape: AttentionShape) -> float:
        return self.attention_at(shape.prefill_chunk, shape.kv_prefill, shape.n_decode, shape.kv_decode)

    def attention_at(self, prefill_chunk: int, kv_prefill: int, n_decode: int, kv_decode: int) -> float:
        """One attention call: causal pairs of the prefill chunk plus one row per decode over its context,
        each pair 4 FLOPs per head dimension (QK^T and PV); every attended token's K and V read once. Plain
        numbers, so a decode run prices its steps without a shape object per step."""
        q = prefill_chunk + n_decode
        if not q:
            return 0.0
        kv_bytes = self._kv_bytes
        pairs = n_decode * kv_decode
        decode_bytes: float = pairs * kv_bytes
        if prefill_chunk:
            pairs = causal_pairs(prefill_chunk, kv_prefill) + pairs
            decode_bytes /= self.hw.mixed_attn_eff
        nbytes = (kv_prefill + prefill_chunk) * kv_bytes + 2 * q * self._q_bytes + decode_bytes
        rate = self._attn_flops * q / (q + self._attn_half)
        compute, memory = self._pair_flops * pairs / rate, nbytes / self._bw
        return self._attn_floor + (compute if compute > memory else memory)

    def skew_alpha(self, shape: AttentionShape, kv_min: int, kv_max: int) -> float:
        return 0.0

    def caveats(self) -> list[str]:
        return []

    def all_reduce_time(self, nbytes: float, tp: int) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        hw = self.hw
        return {"hardware": hw.name, "family": hw.family, "mfu_eff": hw.mfu_eff, "bw_eff": hw.bw_eff,
                "pointwise_eff": hw.pointwise_eff, "attn_eff": hw.attn_eff, "attn_half": hw.attn_half, "mixed_attn_eff": hw.mixed_attn_eff, "kernel_floor": hw.kernel_floor,
                "attn_floor": hw.attn_floor}


class RooflineCostModel(KernelSumCostModel):
    """The kernel sum over `RooflineKernels`."""

    def __init__(self, shape: ModelShape, hardware: Hardware, source: str = "datasheet",
                 deployment: Deployment | None = None, async_scheduling: bool = True,
                 kv_cache_memory: int | None = None) -> None:
        d = deployment or Deployment()
        self.kernels = RooflineKernels(d.rank(shape), hardware)
        super().__init__("roofline", self.kernels, shape, hardware, d, async_scheduling)
        self.source = source
        self.kv_cache_memory = kv_cache_memory

    @classmethod
    def from_args(cls, model: str | dict[str, Any] | None = None, hardware: str | None = None,
                  profile: str | Path | None = None, dtype: str | None = None, deployment: Deployment | None = None,
                  async_scheduling: bool = True, vllm_version: str | None = None) -> RooflineCostModel:
        """Datasheet hardware by name (or FILE.yaml), or measured FLOP/s and bandwidth from a calibration
        profile (then `model` defaults to the profiled model, and a table `hardware` only supplies memory)."""
        d = deployment or Deployment()
        if profile is None:
            if hardware is None:
                raise ValueError(f"roofline cost model: needs a hardware name; valid: {', '.join(hardware_names())}")
            if model is None:
                raise ValueError("roofline cost model: needs a model (preset name, config.json or HF config)")
            return cls(d.shape(model_shape(model, dtype or "bfloat16")), get_hardware(hardware, vllm_version),
                       deployment=d, async_scheduling=async_scheduling)
        from sim.cost_models.profile import load_profile

        prof = load_profile(profile)
        ident = prof.model
        named_dtype = ident.get("dtype")
        prof_dtype = named_dtype if isinstance(named_dtype, str) and named_dtype in DTYPE_BYTES else "bfloat16"
        if not ident.get("hf_config"):
            raise ValueError(f"{profile}: model.hf_config: missing, so effective FLOP/s cannot be derived")
        measured = effective_from_coefficients(prof.coefficients, model_shape(ident["hf_config"], prof_dtype))
        base = get_hardware(hardware) if hardware and hardware.lower() not in CALIBRATION_ONLY else None
        device = prof.device
        name = base.name if base else f"{device.get('type', 'cpu')} (calibrated)"
        hw = Hardware(name, measured["flops"], measured["bandwidth"],
                      base.memory_bytes if base else device.get("memory_bytes"), mfu_eff=1.0, bw_eff=1.0,
                      attn_eff=1.0, attn_half=0.0, mixed_attn_eff=1.0, pointwise_eff=1.0, kernel_floor=0.0, attn_floor=0.0,
                      step_overhead=measured["step_overhead"],
                      seq_overhead=measured["seq_overhead"], note=f"measured on {device.get('name', '?')} from {profile}")
        # Without a memory size (a CPU), the KV cache gets what the calibration run gave it.
        kv = prof.kv_cache
        kv_memory = None
        if hw.memory_bytes is None and kv.get("num_blocks") and kv.get("bytes_per_block"):
            kv_memory = int(kv["num_blocks"]) * int(kv["bytes_per_block"])
        shape = d.shape(model_shape(ident["hf_config"] if model is None else model, dtype or prof_dtype))
        if model is None:
            shape = replace(shape, name=ident.get("model") or shape.name)
        return cls(shape, hw, f"calibration profile {profile}", deployment=d, async_scheduling=False,
                   kv_cache_memory=kv_memory)

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """A decode-only step is priced by `decode_step_times` (one step of a run); any other by the kernel sum."""
        n = batch.num_decode_seqs
        if n and not batch.num_prefill_seqs and batch.num_decode_tokens == n and not batch.moe_tokens:
            one = self.decode_step_times(n, batch.context_tokens, 1)
            return StepTiming(one.device[0], one.host)
        return super().step_time(batch, step)

    def decode_step_times(self, num_seqs: int, context_tokens: int, count: int) -> DecodeStepTimes:
        """The price of every decode-only step: `count` consecutive ones (a decode run, sim.core.decode_runs,
        or one for `step_time`), the first reading `context_tokens` of context and each next one `num_seqs`
        more. The kernel sum's terms for such a batch: the fixed kernels at `num_seqs` tokens, looked up
        once, and attention at the mean context (the roofline has no skew, so the sum is all it needs)."""
        n, layers, attention = num_seqs, self.shape.num_layers, self.kernels.attention_at
        fixed, inside = self._fixed(n, n)
        device = [fixed + layers * attention(0, 0, n, mean_context(c, n))
                  for c in range(context_tokens, context_tokens + n * count, n)]
        self.num_steps += count
        if not inside:
            self.steps_outside += count
        return DecodeStepTimes(device, 0.0 if self.async_scheduling else self.host_time(n))

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int:
        if kv_cache_memory is None:
            kv_cache_memory = self.kv_cache_memory
        if kv_cache_memory is None and self.hardware.memory_bytes is None:
            kv_cache_memory = CPU_KV_CACHE_MEMORY
        return kv_blocks(self.rank, self.hardware, block_size, gpu_memory_utilization, max_num_batched_tokens,
                         kv_cache_memory)

    def describe(self) -> CostModelInfo:
        info = super().describe()
        return replace(info, meta={**info.meta, "source": self.source, "effective_flops": self.hardware.effective_flops,
                                   "effective_bandwidth": self.hardware.effective_bandwidth,
                                   "kv_cache_memory": self.kv_cache_memory})


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
    flops_from, bw_from = max(flops, key=flops.__getitem__), max(bandwidth, key=bandwidth.__getitem__)
    if not flops[flops_from]:
        raise ValueError("the fit has no per-token cost (c_p = c_d = 0): effective FLOP/s cannot be derived")
    if not bandwidth[bw_from]:
        raise ValueError("the fit has no fixed or context cost (c0 = c_ctx = 0): bandwidth cannot be derived")
    bw = bandwidth[bw_from]
    return {"flops": flops[flops_from], "bandwidth": bw, "step_overhead": max(coef["c0"] - weights / bw, 0.0),
            "seq_overhead": coef["c_seq"], "flops_from": flops_from, "bandwidth_from": bw_from,
            "flops_bounds": flops, "bandwidth_bounds": bandwidth, "model": shape.name, "dtype": shape.dtype}
