"""Paged attention on Triton kernels: fused KV store, split-K decode and chunked-prefill attention.

Kernels are reached through their modules (not imported by name) so a test that reloads them
under TRITON_INTERPRET=1 is picked up here too.
"""
from __future__ import annotations

import torch

from engine.model_executor.attention import torch_backend, triton_cache, triton_decode, triton_prefill
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


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata | None,
    scale: float,
) -> torch.Tensor:
    """Same contract as the torch backend; without metadata or a cache (profiling) it defers to it."""
    if meta is None or kv_cache is None:
        return torch_backend.forward(q, k, v, kv_cache, meta, scale)
    check_head_size(q.shape[-1])
    assert q.dtype in SUPPORTED_DTYPES, f"triton attention supports {SUPPORTED_DTYPES}, got {q.dtype}"
    n = meta.num_actual_tokens
    out = torch.empty_like(q)
    out[n:].zero_()
    triton_cache.store_kvcache(k[:n], v[:n], kv_cache, meta.slot_mapping[:n])
    nd = meta.num_decodes
    if nd:
        assert meta.num_decode_tokens == nd, "decode sequences must have query length 1"
        triton_decode.paged_decode(
            q[:nd], kv_cache, meta.block_tables, meta.seq_lens, max(meta.seq_lens_cpu[:nd]), scale, out
        )
    num_prefills = meta.num_seqs - nd
    if num_prefills:
        triton_prefill.paged_prefill(
            q, kv_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            nd, num_prefills, meta.max_query_len, scale, out,
        )
    return out


class TritonAttentionBackend:
    """Backend interface of TorchAttentionBackend, on Triton kernels (CUDA, or CPU under the interpreter)."""

    name = "triton"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        check_head_size(head_size)
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    reshape_and_cache = staticmethod(reshape_and_cache)
    forward = staticmethod(forward)
