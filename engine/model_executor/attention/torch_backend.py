"""Reference paged attention in plain PyTorch.

It is the backend every other one is checked against, so it favours clarity and exactness
(float32 softmax and accumulation) over speed; it still runs unchanged on CUDA.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model_executor.attention import cpu_decode, cpu_native
from engine.model_executor.attention.abstract import AttentionBackend
from engine.model_executor.forward_context import AttentionMetadata

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` as the cache stores it. fp8 saturates at +-FP8_MAX explicitly, as vLLM's conversion with scale 1.0
    does, instead of relying on what a given torch's cast makes of values out of range."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8) if dtype == FP8 else x.to(dtype)


def as_cached(x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """`x` in its own dtype as it reads back from the cache: a fresh prompt attends to what later steps will
    read, not to values an fp8 cache cannot hold."""
    return to_cache_dtype(x, kv_cache.dtype).to(x.dtype) if kv_cache.dtype == FP8 else x


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V [T, kvh, d] into their cache slots; slot -1 marks padding and is skipped."""
    _, num_blocks, block_size, num_kv_heads, head_size = kv_cache.shape
    fp8 = kv_cache.dtype == FP8
    store = kv_cache.view(torch.uint8) if fp8 else kv_cache  # index_copy_ has no fp8 kernel: copy the bytes
    flat = store.view(2, num_blocks * block_size, num_kv_heads, head_size)
    num_tokens = slot_mapping.shape[0]
    key, value = key[:num_tokens], value[:num_tokens]
    if slot_mapping.device.type != "cpu" or (num_tokens and int(slot_mapping.min()) < 0):
        valid = slot_mapping >= 0
        slot_mapping = slot_mapping[valid]  # boolean indexing syncs on CUDA; fused kernels avoid this later
        key, value = key[valid], value[valid]
    key, value = to_cache_dtype(key, kv_cache.dtype), to_cache_dtype(value, kv_cache.dtype)
    flat[0].index_copy_(0, slot_mapping, key.view(torch.uint8) if fp8 else key)
    flat[1].index_copy_(0, slot_mapping, value.view(torch.uint8) if fp8 else value)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, context_len: int = 0
) -> torch.Tensor:
    """One sequence: q [Lq, nh, d] at positions context_len.., over k/v [context_len + Lq, kvh, d]."""
    num_q, num_heads, _ = q.shape
    num_k = k.shape[0]
    assert num_k == context_len + num_q, (num_k, context_len, num_q)
    # 4-D [1, heads, L, d]: with 3-D inputs SDPA on CPU falls back to its much slower math kernel.
    qf = q.transpose(0, 1).float()[None]
    kf = k.transpose(0, 1).float()[None]
    vf = v.transpose(0, 1).float()[None]
    gqa = num_heads != k.shape[1]
    if context_len == 0:
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        q_pos = torch.arange(context_len, num_k, device=q.device)
        mask = torch.arange(num_k, device=q.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1).to(q.dtype)


DECODE_GROUP = 8


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 max_seq_len: int, scale: float) -> torch.Tensor:
    """All single-token queries at once: gather their blocks, mask past seq_len, one fused SDPA call
    with grouped-query heads (no K/V repeat)."""
    num_seqs, num_heads, head_size = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    num_blocks = -(-max_seq_len // block_size)
    length = num_blocks * block_size
    # index_select copies whole blocks; advanced indexing is far slower on CPU for the same gather.
    kv = kv_cache.index_select(1, block_tables[:, :num_blocks].reshape(-1))
    kv = kv.view(2, num_seqs, length, num_kv_heads, head_size).transpose(2, 3).float()
    k, v = kv[0], kv[1]
    valid = torch.arange(length, device=q.device)[None, :] < seq_lens[:, None]
    out = F.scaled_dot_product_attention(q.float().view(num_seqs, num_heads, 1, head_size), k, v,
                                         attn_mask=valid[:, None, None, :], scale=scale,
                                         enable_gqa=num_heads != num_kv_heads)
    return out.view(num_seqs, num_heads, head_size).to(q.dtype)


def _decode_index(meta: AttentionMetadata, kv_cache: torch.Tensor, num_heads: int) -> cpu_decode.DecodeIndex:
    """The step's decode index, built by the first layer that asks and reused by the others."""
    num_kv_heads = kv_cache.shape[3]
    index = meta.decode_index
    if not isinstance(index, cpu_decode.DecodeIndex) or (index.num_heads, index.num_kv_heads) != (
            num_heads, num_kv_heads):
        index = cpu_decode.build_decode_index(meta.block_tables, meta.seq_lens_cpu[:meta.num_decodes],
                                              kv_cache.shape[2], num_heads, num_kv_heads)
        meta.decode_index = index
    return index


def _gather_context(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [seq_len, kvh, d] of one sequence, read through its block table."""
    block_size = kv_cache.shape[2]
    kv = kv_cache.index_select(1, block_table[: -(-seq_len // block_size)]).flatten(1, 2)[:, :seq_len]
    return kv[0], kv[1]


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata | None,
    scale: float,
) -> torch.Tensor:
    """q [T, nh, d], k/v [T, kvh, d] -> [T, nh, d]; rows past meta.num_actual_tokens come back zero.

    Without metadata the whole input is one causal sequence; without a cache each sequence in
    query_start_loc attends only to itself. Otherwise K/V are cached first and every query reads
    its full context through the block tables.
    """
    if meta is None:
        return causal_attention(q, k, v, scale)
    qsl = meta.query_start_loc_cpu
    if kv_cache is None:
        out = torch.zeros_like(q)
        for i in range(meta.num_seqs):
            s, e = qsl[i], qsl[i + 1]
            out[s:e] = causal_attention(q[s:e], k[s:e], v[s:e], scale)
        return out
    n = meta.num_actual_tokens
    reshape_and_cache(k[:n], v[:n], kv_cache, meta.slot_mapping[:n])
    nd = meta.num_decodes
    assert meta.num_decode_tokens == nd, "decode sequences must have query length 1"
    only_decodes = nd == meta.num_seqs == q.shape[0]
    native = nd > 0 and cpu_native.supports(q, kv_cache)
    if only_decodes and not native and cpu_decode.supports(kv_cache):
        # No padding rows: the torch decode path's output is the whole answer.
        return cpu_decode.paged_decode(q, kv_cache, _decode_index(meta, kv_cache, q.shape[1]), scale)
    out = torch.empty_like(q) if only_decodes else torch.zeros_like(q)
    if native:
        cpu_native.paged_decode(q[:nd], kv_cache, meta.block_tables, meta.seq_lens, scale, out[:nd])
    elif nd and cpu_decode.supports(kv_cache):
        out[:nd] = cpu_decode.paged_decode(q[:nd], kv_cache, _decode_index(meta, kv_cache, q.shape[1]), scale)
    elif nd:
        # Contiguous groups, each padded only to its own longest context: with decodes ordered by
        # length (the runner does this) padding, and so wasted attention work, stays small.
        lens = meta.seq_lens_cpu
        for a in range(0, nd, DECODE_GROUP):
            b = min(a + DECODE_GROUP, nd)
            out[a:b] = paged_decode(q[a:b], kv_cache, meta.block_tables[a:b], meta.seq_lens[a:b],
                                    max(lens[a:b]), scale)
    for i in range(nd, meta.num_seqs):
        s, e, seq_len = qsl[i], qsl[i + 1], meta.seq_lens_cpu[i]
        context_len = seq_len - (e - s)
        if context_len == 0:
            ck, cv = as_cached(k[s:e], kv_cache), as_cached(v[s:e], kv_cache)
        else:
            ck, cv = _gather_context(kv_cache, meta.block_tables[i], seq_len)
        out[s:e] = causal_attention(q[s:e], ck, cv, scale, context_len)
    return out


class TorchAttentionBackend(AttentionBackend):
    """The backend interface implemented with torch ops."""

    name = "torch"
    reshape_and_cache = staticmethod(reshape_and_cache)
    forward = staticmethod(forward)
