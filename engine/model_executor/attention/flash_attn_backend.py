"""Paged attention on flash-attn 2.x kernels (optional dependency, imported under a guard).

Our per-layer cache (2, num_blocks, block_size, kvh, d) splits into exactly flash-attn's paged
layout: k_cache = kv_cache[0] and v_cache = kv_cache[1], each (num_blocks, page_block_size, kvh, d).
Constraints of upstream flash-attn 2.x paged KV (checked here so the failure is ours, not a
kernel assert): page_block_size must be a multiple of 256, inputs fp16/bf16, head size a multiple
of 8 up to 256, and `block_table` on flash_attn_varlen_func needs flash-attn >= 2.6.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from engine.model_executor.attention import torch_backend
from engine.model_executor.attention.abstract import AttentionBackend
from engine.model_executor.attention.paged import paged_backend_forward
from engine.model_executor.forward_context import AttentionMetadata

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError as e:  # not installed, or built against another torch/CUDA
    flash_attn_varlen_func = flash_attn_with_kvcache = None
    IMPORT_ERROR: str | None = f"flash-attn is not installed or failed to import ({e})"
else:
    IMPORT_ERROR = None
    if "block_table" not in inspect.signature(flash_attn_varlen_func).parameters:
        IMPORT_ERROR = "flash-attn is too old: flash_attn_varlen_func has no block_table (needs >= 2.6)"

try:
    from engine.model_executor.attention import triton_cache
    HAS_TRITON_CACHE = True
except ImportError:  # no triton: the torch scatter works too, at the cost of one host sync
    HAS_TRITON_CACHE = False

PAGED_BLOCK_MULTIPLE = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def unsupported_reason(
    block_size: int | None = None, dtype: torch.dtype | None = None, head_size: int | None = None
) -> str | None:
    """Why flash-attn cannot serve this configuration (None when it can); unknown values are not checked."""
    if IMPORT_ERROR is not None:
        return IMPORT_ERROR
    if block_size is not None and block_size % PAGED_BLOCK_MULTIPLE:
        return f"flash-attn paged KV needs block_size to be a multiple of {PAGED_BLOCK_MULTIPLE}, got {block_size}"
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        return f"flash-attn supports only float16/bfloat16, got {dtype}"
    if head_size is not None and (head_size % 8 or head_size > 256):
        return f"flash-attn needs a head size that is a multiple of 8 and at most 256, got {head_size}"
    return None


def _check(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    """The queries' dtype and the cache's (an fp8 cache is refused: these kernels read it as 16-bit)."""
    for dtype in (q.dtype, kv_cache.dtype):
        reason = unsupported_reason(kv_cache.shape[2], dtype, q.shape[-1])
        if reason is not None:
            raise RuntimeError(reason)


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V [T, kvh, d] into their cache slots; slot -1 marks padding and is skipped."""
    if HAS_TRITON_CACHE and kv_cache.is_cuda:
        triton_cache.store_kvcache(key, value, kv_cache, slot_mapping)
    else:
        torch_backend.reshape_and_cache(key, value, kv_cache, slot_mapping)


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor,
            nd: int) -> None:
    out[:nd] = flash_attn_with_kvcache(
        q[:nd, None], kv_cache[0], kv_cache[1],
        cache_seqlens=meta.seq_lens[:nd], block_table=meta.block_tables[:nd],
        softmax_scale=scale, causal=True,
    ).squeeze(1)


def _prefill(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor,
             nd: int) -> None:
    qsl, n = meta.query_start_loc_cpu, meta.num_actual_tokens
    start = qsl[nd]
    cu_seqlens_k = F.pad(meta.seq_lens[nd:].cumsum(0, dtype=torch.int32), (1, 0))
    out[start:n] = flash_attn_varlen_func(
        q[start:n], kv_cache[0], kv_cache[1],
        meta.query_start_loc[nd:] - start, cu_seqlens_k,
        max(qsl[i + 1] - qsl[i] for i in range(nd, meta.num_seqs)), max(meta.seq_lens_cpu[nd:]),
        softmax_scale=scale, causal=True, block_table=meta.block_tables[nd:],
    )


# Same contract as the torch backend (the shared steps are in attention/paged.py).
forward = paged_backend_forward(store=reshape_and_cache, decode=_decode, prefill=_prefill, check=_check)


class FlashAttentionBackend(AttentionBackend):
    """Backend interface of TorchAttentionBackend, on flash-attn's paged varlen and kv-cache kernels."""

    name = "flash-attn"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        reason = unsupported_reason(block_size=block_size, head_size=head_size)
        if reason is not None:
            raise RuntimeError(reason)
        return AttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)

    reshape_and_cache = staticmethod(reshape_and_cache)
    forward = staticmethod(forward)
