"""Triton KV store: scatter one step's K/V into the paged cache without a host sync.

The torch reference drops padding slots with boolean indexing, which waits for the GPU to
know how many survive; here every token gets a program and a -1 slot just masks its stores.
An fp8 cache saturates at +-448 as the torch reference does (torch_backend.to_cache_dtype).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model_executor.attention.torch_backend import FP8, FP8_MAX


@triton.jit
def _store_kvcache_kernel(
    key_ptr, value_ptr, cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_c_kv, stride_c_blk, stride_c_pos, stride_c_h,
    num_kv_heads, head_size,
    BLOCK_SIZE: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr, CLAMP: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HEAD_PAD)[None, :]
    # a padding slot masks every head (written via where: the interpreter rejects a scalar mask term)
    mask = (heads < tl.where(slot >= 0, num_kv_heads, 0)) & (dims < head_size)
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    if CLAMP > 0:  # an fp8 cache: the cast alone would not saturate everywhere (the interpreter's does not)
        k = tl.minimum(tl.maximum(k.to(tl.float32), -CLAMP), CLAMP)
        v = tl.minimum(tl.maximum(v.to(tl.float32), -CLAMP), CLAMP)
    row = (slot // BLOCK_SIZE) * stride_c_blk + (slot % BLOCK_SIZE) * stride_c_pos
    dst = cache_ptr + row + heads * stride_c_h + dims
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_c_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def store_kvcache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, kvh, d] to kv_cache (2, blocks, block_size, kvh, d) at slot_mapping [T]; -1 skips."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    assert key.shape[1:] == value.shape[1:] == (num_kv_heads, head_size), (key.shape, kv_cache.shape)
    assert key.stride(-1) == value.stride(-1) == kv_cache.stride(-1) == 1, "head dim must be contiguous"
    _store_kvcache_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        num_kv_heads, head_size,
        BLOCK_SIZE=block_size,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_PAD=triton.next_power_of_2(head_size),
        CLAMP=FP8_MAX if kv_cache.dtype == FP8 else 0.0,
    )
