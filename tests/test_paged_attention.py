"""The torch paged-attention backend against a naive dense float64 reference."""
from __future__ import annotations

import pytest
import torch

from engine.model_executor.attention import get_attn_backend
from engine.model_executor.attention.torch_backend import TorchAttentionBackend, forward, reshape_and_cache
from engine.model_executor.forward_context import build_attn_metadata

DEVICE = torch.device("cpu")
NUM_KV_HEADS = 2


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq, nh, d] are the last Lq positions of a sequence whose full K/V is k, v [S, kvh, d]."""
    num_q, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kh = k.double().repeat_interleave(group, dim=1)  # head h reads kv head h // group
    vh = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kh) * scale
    q_pos = torch.arange(seq_len - num_q, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vh)


def make_case(query_lens, seq_lens, num_heads, head_size, block_size, dtype=torch.float32, seed=0):
    """Random full K/V per sequence, a shuffled block pool, and a cache already holding each cached prefix."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for n in need:
        tables.append(perm[start : start + n])
        start += n
    shape = TorchAttentionBackend.get_kv_cache_shape(num_blocks, block_size, NUM_KV_HEADS, head_size)
    cache = torch.zeros(shape, dtype=dtype)
    seqs = []
    for ql, sl, table in zip(query_lens, seq_lens, tables):
        k = torch.randn(sl, NUM_KV_HEADS, head_size, generator=gen).to(dtype)
        v = torch.randn(sl, NUM_KV_HEADS, head_size, generator=gen).to(dtype)
        q = torch.randn(ql, num_heads, head_size, generator=gen).to(dtype)
        ctx = sl - ql
        if ctx:
            prefix = build_attn_metadata([ctx], [ctx], [table], block_size, DEVICE)
            reshape_and_cache(k[:ctx], v[:ctx], cache, prefix.slot_mapping)
        seqs.append((q, k, v))
    meta = build_attn_metadata(query_lens, seq_lens, tables, block_size, DEVICE)
    q = torch.cat([s[0] for s in seqs])
    k_new = torch.cat([s[1][sl - ql :] for s, ql, sl in zip(seqs, query_lens, seq_lens)])
    v_new = torch.cat([s[2][sl - ql :] for s, ql, sl in zip(seqs, query_lens, seq_lens)])
    return seqs, cache, meta, q, k_new, v_new


def check_against_reference(out, seqs, query_lens, scale, atol=1e-5):
    start = 0
    for (q, k, v), ql in zip(seqs, query_lens):
        ref = dense_reference(q, k, v, scale)
        torch.testing.assert_close(out[start : start + ql].double(), ref, atol=atol, rtol=atol)
        start += ql


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa_ratio", [1, 4, 8])
def test_mixed_ragged_batch_matches_dense_reference(gqa_ratio, head_size, block_size):
    # three decodes of ragged length, a fresh prefill, and a prefill chunk over a cached prefix
    query_lens = [1, 1, 1, 9, 21]
    seq_lens = [5, 40, 33, 9, 70]
    num_heads = NUM_KV_HEADS * gqa_ratio
    seqs, cache, meta, q, k, v = make_case(query_lens, seq_lens, num_heads, head_size, block_size)
    assert meta.num_decodes == 3
    scale = head_size**-0.5
    out = forward(q, k, v, cache, meta, scale)
    check_against_reference(out, seqs, query_lens, scale)


def test_prefill_chunk_attends_to_cached_prefix_across_block_boundaries():
    query_lens, seq_lens = [7, 16, 3], [23, 48, 19]  # chunks start mid-block (16, 32 and 16)
    seqs, cache, meta, q, k, v = make_case(query_lens, seq_lens, 8, 64, 16, seed=1)
    assert meta.num_decodes == 0
    out = forward(q, k, v, cache, meta, 0.125)
    check_against_reference(out, seqs, query_lens, 0.125)


def test_step_kv_is_written_into_cache_through_block_table():
    query_lens, seq_lens = [1, 12], [20, 12]
    seqs, cache, meta, q, k, v = make_case(query_lens, seq_lens, 4, 64, 16, seed=2)
    forward(q, k, v, cache, meta, 0.125)
    for (_, full_k, full_v), table, sl in zip(seqs, meta.block_tables.tolist(), seq_lens):
        blocks = table[: -(-sl // 16)]
        torch.testing.assert_close(cache[0][blocks].flatten(0, 1)[:sl], full_k, atol=0, rtol=0)
        torch.testing.assert_close(cache[1][blocks].flatten(0, 1)[:sl], full_v, atol=0, rtol=0)


def test_padding_slots_are_not_written_and_padded_rows_are_zero():
    head_size, block_size = 64, 16
    _, cache, meta, q, k, v = make_case([1, 5], [9, 5], 4, head_size, block_size, seed=3)
    pad = 3
    padded = build_attn_metadata([1, 5], [9, 5], meta.block_tables.tolist(), block_size, DEVICE, num_padding=pad)
    cache.fill_(7.0)
    q = torch.cat([q, torch.randn(pad, 4, head_size)])
    k = torch.cat([k, torch.full((pad, NUM_KV_HEADS, head_size), -5.0)])
    v = torch.cat([v, torch.full((pad, NUM_KV_HEADS, head_size), -5.0)])
    before = cache.clone()
    out = forward(q, k, v, cache, padded, 0.125)
    written = torch.zeros(cache.shape[1] * block_size, dtype=torch.bool)
    written[padded.slot_mapping[: padded.num_actual_tokens]] = True
    changed = (cache != before).flatten(3).any(-1).flatten(1, 2).any(0)
    assert torch.equal(changed, written)
    assert not (cache == -5.0).any()
    assert torch.all(out[padded.num_actual_tokens :] == 0)


def test_reshape_and_cache_skips_minus_one_slots_anywhere():
    cache = torch.zeros(2, 4, 16, NUM_KV_HEADS, 64)
    key = torch.arange(1, 5, dtype=torch.float32)[:, None, None].expand(4, NUM_KV_HEADS, 64)
    slots = torch.tensor([3, -1, 37, -1])
    reshape_and_cache(key, -key, cache, slots)
    flat_k = cache[0].flatten(0, 1)
    assert torch.all(flat_k[3] == 1) and torch.all(flat_k[37] == 3)
    assert torch.count_nonzero(flat_k.flatten(1).any(-1)) == 2
    assert torch.all(cache[1].flatten(0, 1)[37] == -3)


def test_without_metadata_input_is_one_causal_sequence():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(13, h, 64, generator=gen) for h in (8, 2, 2))
    out = forward(q, k, v, None, None, 0.125)
    torch.testing.assert_close(out.double(), dense_reference(q, k, v, 0.125), atol=1e-5, rtol=1e-5)


def test_without_cache_each_sequence_attends_only_to_itself():
    gen = torch.Generator().manual_seed(5)
    lens = [4, 9, 1]
    qs = [torch.randn(n, 4, 64, generator=gen) for n in lens]
    ks = [torch.randn(n, 2, 64, generator=gen) for n in lens]
    vs = [torch.randn(n, 2, 64, generator=gen) for n in lens]
    meta = build_attn_metadata(lens, lens, [[0]] * 3, 16, DEVICE)
    out = forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), None, meta, 0.125)
    check_against_reference(out, list(zip(qs, ks, vs)), lens, 0.125)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_stay_within_output_rounding(dtype):
    query_lens, seq_lens = [1, 1, 30], [200, 7, 150]
    seqs, cache, meta, q, k, v = make_case(query_lens, seq_lens, 8, 128, 16, dtype=dtype, seed=6)
    out = forward(q, k, v, cache, meta, 128**-0.5)
    assert out.dtype == dtype
    # the reference sees the same rounded inputs, so only accumulation and the final cast differ
    check_against_reference(out.float(), seqs, query_lens, 128**-0.5, atol=1e-2)


def test_backend_lookup_resolves_auto_and_rejects_unknown_names():
    assert get_attn_backend("auto", "cpu") is TorchAttentionBackend
    assert get_attn_backend("torch", torch.device("cpu")) is TorchAttentionBackend
    with pytest.raises(NotImplementedError, match="triton"):
        get_attn_backend("triton", "cpu")
    with pytest.raises(ValueError, match="nope"):
        get_attn_backend("nope", "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_decodes_of_ragged_lengths_span_several_decode_groups(dtype):
    # float32 takes the C decode kernel (cpu_native), float64 the gathered groups
    from engine.model_executor.attention.torch_backend import DECODE_GROUP

    num = 2 * DECODE_GROUP + 3
    seq_lens = [5 + (i * 37) % 90 for i in range(num)]
    query_lens = [1] * num + [7]
    seq_lens = seq_lens + [40]
    seqs, cache, meta, q, k, v = make_case(query_lens, seq_lens, 4, 64, 16, dtype=dtype)
    out = forward(q, k, v, cache, meta, 64**-0.5)
    check_against_reference(out, seqs, query_lens, 64**-0.5)
