"""Paged attention on Triton kernels: fused KV store, split-K decode and chunked-prefill attention.

Kernels are reached through their modules (not imported by name) so a test that reloads them
under TRITON_INTERPRET=1 is picked up here too.
"""
from __future__ import annotations

import torch

from engine.model_executor.attention import triton_cache, triton_decode, triton_prefill
from engine.model_executor.attention.abstract import AttentionBackend
from engine.model_executor.attention.paged import paged_backend_forward
from engine.model_executor.forward_context import AttentionMetadata

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernels_interpreted() -> bool:
    """True when the kernels were built by Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return triton_decode.kernels_interpreted()


def check_head_size(head_size: int) -> None:
    """The kernels tile the head dimension with one power-of-two block."""
    assert head_size >= 16 and head_size & (head_size - 1) == 0, (
        f"triton attention needs a power-of-two head size >= 16 (64 and 128 are tested), got {head_size}"
    )


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V [T, kvh, d] into their cache slots; slot -1 marks padding and is skipped."""
    triton_cache.store_kvcache(key, value, kv_cache, slot_mapping)


def _check(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    check_head_size(q.shape[-1])
    assert q.dtype in SUPPORTED_DTYPES, f"triton attention supports {SUPPORTED_DTYPES}, got {q.dtype}"


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor,
            nd: int) -> None:
    triton_decode.paged_decode(q[:nd], kv_cache, meta.block_tables, meta.seq_lens, max(meta.seq_lens_cpu[:nd]),
                               scale, out)


def _prefill(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, out: torch.Tensor,
             nd: int) -> None:
    triton_prefill.paged_prefill(q, kv_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                 nd, meta.num_seqs - nd, meta.max_query_len, scale, out)


# Same contract as the torch backend (the shared steps are in attention/paged.py).
forward = paged_backend_forward(store=reshape_and_cache, decode=_decode, prefill=_prefill, check=_check)


class TritonAttentionBackend(AttentionBackend):
    """Backend interface of TorchAttentionBackend, on Triton kernels (CUDA, or CPU under the interpreter)."""

    name = "triton"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        check_head_size(head_size)
        return AttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)

    reshape_and_cache = staticmethod(reshape_and_cache)
    forward = staticmethod(forward)
