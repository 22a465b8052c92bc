"""Fused float32 CPU kernels (csrc/cpu_ops.c) for the decoder layer's pointwise work.

Through torch, a small model's residual adds, RMS norms, q/k norm and rotary embedding and SiLU gate are
a large share of a CPU decode step: each elementary op is a pass over memory and a dispatch. Each kernel
here is one pass. They round as the torch path does (no fused multiply-add)
but for the order of an RMS norm's sum of squares and silu's exp (within 2e-7 relative): last-bit
differences, which the engine-against-transformers tests check leave greedy outputs unchanged.

Every entry point returns None (or False) when its inputs are not what the kernel takes (not float32
on the CPU, rows not contiguous, the library not built: native_build); callers then run their torch
code, which stays the reference.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.model_executor.native_build import load_library

SOURCE = Path(__file__).with_name("csrc") / "cpu_ops.c"
ABI_VERSION = 1
# The torch path rounds every product on its own; a contracted a * b + c would round once.
EXTRA_FLAGS = ("-ffp-contract=off",)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The kernels, built on first use; None when they cannot be had here."""
    lib = load_library(SOURCE, "stepscope_cpu_ops_abi", ABI_VERSION, EXTRA_FLAGS)
    if lib is None:
        return None
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.stepscope_rms_norm_f32.argtypes = [p, i64, p, i64, p, i64, i32, f32, p, i64, i32]
    lib.stepscope_rms_norm_f32.restype = None
    lib.stepscope_qk_norm_rope_f32.argtypes = [p, i64, i64, i32, i32, i32, i32, p, p, f32, p, p, i64, p, p, i32]
    lib.stepscope_qk_norm_rope_f32.restype = i32
    lib.stepscope_silu_and_mul_f32.argtypes = [p, i64, i64, i32, p, i64, i32]
    lib.stepscope_silu_and_mul_f32.restype = None
    return lib


def _rows(x: torch.Tensor) -> bool:
    """A float32 CPU matrix whose rows are contiguous (the kernels' layout)."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels take this activation at all (decided once per forward)."""
    return _rows(x) and load() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """weight * (s / rms(s)) with s = x, or s = x + residual written into x (the new residual stream)."""
    lib = load()
    if (lib is None or not _rows(x) or weight.dtype != torch.float32 or weight.dim() != 1
            or not weight.is_contiguous() or weight.shape[0] != x.shape[1]
            or (residual is not None and (not _rows(residual) or residual.shape != x.shape))):
        return None
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    lib.stepscope_rms_norm_f32(x.data_ptr(), x.stride(0), 0 if residual is None else residual.data_ptr(),
                               0 if residual is None else residual.stride(0), weight.data_ptr(), x.shape[0],
                               x.shape[1], eps, out.data_ptr(), out.stride(0), torch.get_num_threads())
    return out


def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, rotary_dim: int,
                 cos_sin_cache: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q [T, heads * d], k [T, kv heads * d]) from the q and k columns of qkv [T, >= (heads + kv) * d]:
    each head RMS-normed by its weight (when weights are given), then rotated (neox) at its position
    (cos_sin_cache [max_position, rotary_dim]: cos half, sin half). IndexError for a position outside it."""
    lib = load()
    weights = [w for w in (q_weight, k_weight) if w is not None]
    if len(weights) == 1:  # both heads' norms or neither
        return None
    if (lib is None or not _rows(qkv) or qkv.shape[1] < (num_heads + num_kv_heads) * head_dim
            or rotary_dim % 2 or rotary_dim > head_dim or cos_sin_cache.dtype != torch.float32
            or not cos_sin_cache.is_contiguous() or cos_sin_cache.shape[1] != rotary_dim
            or positions.dtype != torch.int64 or not positions.is_contiguous()
            or any(w.dtype != torch.float32 or w.shape != (head_dim,) or not w.is_contiguous() for w in weights)):
        return None
    tokens = qkv.shape[0]
    q = qkv.new_empty(tokens, num_heads * head_dim)
    k = qkv.new_empty(tokens, num_kv_heads * head_dim)
    rc = lib.stepscope_qk_norm_rope_f32(
        qkv.data_ptr(), qkv.stride(0), tokens, num_heads, num_kv_heads, head_dim, rotary_dim,
        0 if q_weight is None else q_weight.data_ptr(), 0 if k_weight is None else k_weight.data_ptr(), eps,
        cos_sin_cache.data_ptr(), positions.data_ptr(), cos_sin_cache.shape[0], q.data_ptr(), k.data_ptr(),
        torch.get_num_threads())
    if rc != 0:
        raise IndexError(f"rotary position out of range [0, {cos_sin_cache.shape[0]})")
    return q, k


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up for x [T, 2 * d] holding gate then up."""
    lib = load()
    if lib is None or not _rows(x) or x.shape[1] % 2:
        return None
    dim = x.shape[1] // 2
    out = x.new_empty(x.shape[0], dim)
    lib.stepscope_silu_and_mul_f32(x.data_ptr(), x.stride(0), x.shape[0], dim, out.data_ptr(), out.stride(0),
                                   torch.get_num_threads())
    return out
