"""Triton attention kernels against the torch reference backend, on CPU through Triton's interpreter.

Triton picks interpreter vs compiler when @triton.jit decorates a function, not at launch, and
triton.language decorates its own helpers (tl.max, tl.sum, tl.zeros) when first imported. So the
fixture below sets TRITON_INTERPRET=1 and then re-runs every module that decorates kernels
(triton's and ours), which works even if another test imported triton first; on teardown it
restores the variable and re-runs them again so later tests see compiled-mode kernels.
"""
from __future__ import annotations


import pytest
from triton_interp import interpreted
import torch

from engine.model_executor.attention import (
    AttentionBackendUnavailableError,
    flash_attn_backend,
    get_attn_backend,
    torch_backend,
    triton_backend,
    triton_cache,
    triton_decode,
)
from engine.model_executor.forward_context import build_attn_metadata

JIT_MODULES = (
    "engine.model_executor.attention.triton_cache",
    "engine.model_executor.attention.triton_decode",
    "engine.model_executor.attention.triton_prefill",
    "engine.model_executor.attention.triton_backend",
)
NUM_KV_HEADS = 2


@pytest.fixture(scope="module", autouse=True)
def triton_interpreter():
    with interpreted(JIT_MODULES):
        assert triton_backend.kernels_interpreted()
        yield


def make_batch(query_lens, seq_lens, num_heads, head_size, block_size, dtype=torch.float32, seed=0, num_padding=0):
    """Shuffled block tables, a cache of random garbage that already holds each sequence's context
    (its first seq_len - query_len tokens), and this step's q/k/v (plus `num_padding` junk rows)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s in seq_lens]
    perm = torch.randperm(sum(need) + 2, generator=gen).tolist()
    tables = [perm[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(need))]
    shape = triton_backend.TritonAttentionBackend.get_kv_cache_shape(len(perm), block_size, NUM_KV_HEADS, head_size)
    cache = torch.randn(shape, generator=gen).to(dtype)
    ks, vs = [], []
    for ql, sl, table in zip(query_lens, seq_lens, tables):
        k, v = (torch.randn(sl, NUM_KV_HEADS, head_size, generator=gen).to(dtype) for _ in range(2))
        if sl > ql:
            slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(sl - ql)])
            torch_backend.reshape_and_cache(k[: sl - ql], v[: sl - ql], cache, slots)
        ks.append(k[sl - ql :])
        vs.append(v[sl - ql :])
    meta = build_attn_metadata(query_lens, seq_lens, tables, block_size, "cpu", num_padding=num_padding)
    total = sum(query_lens) + num_padding
    q = torch.randn(total, num_heads, head_size, generator=gen).to(dtype)
    pad = torch.full((num_padding, NUM_KV_HEADS, head_size), -5.0, dtype=dtype)
    return cache, meta, q, torch.cat(ks + [pad]), torch.cat(vs + [pad])


def check_forward(query_lens, seq_lens, num_heads, head_size, block_size, atol=1e-4, **kw):
    """Run both backends on copies of one batch; outputs and final caches must agree."""
    cache, meta, q, k, v = make_batch(query_lens, seq_lens, num_heads, head_size, block_size, **kw)
    ref_cache = cache.clone()
    scale = head_size**-0.5
    out = triton_backend.forward(q, k, v, cache, meta, scale)
    ref = torch_backend.forward(q, k, v, ref_cache, meta, scale)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
    assert torch.equal(cache, ref_cache)
    return out, meta


def test_store_matches_reference_and_skips_padding_slots():
    cache = torch.full((2, 6, 16, NUM_KV_HEADS, 64), 7.0)
    ref = cache.clone()
    slots = torch.tensor([-1, 3, 40, -1, 95, 16, -1])
    key, value = torch.randn(7, NUM_KV_HEADS, 64), torch.randn(7, NUM_KV_HEADS, 64)
    triton_cache.store_kvcache(key, value, cache, slots)
    torch_backend.reshape_and_cache(key, value, ref, slots)
    assert torch.equal(cache, ref)
    changed = (cache != 7.0).flatten(3).any(-1).flatten(1, 2).any(0)
    assert changed.nonzero().flatten().tolist() == [3, 16, 40, 95]


def test_store_reads_strided_views_and_casts_to_cache_dtype():
    # k and v are column slices of a fused projection; fp32 values that bf16 holds exactly, since
    # the interpreter's own float rounding differs from the GPU's (round to nearest even)
    qkv = torch.randn(5, 3 * NUM_KV_HEADS * 64).bfloat16().float()
    key = qkv[:, NUM_KV_HEADS * 64 : 2 * NUM_KV_HEADS * 64].view(5, NUM_KV_HEADS, 64)
    value = qkv[:, 2 * NUM_KV_HEADS * 64 :].view(5, NUM_KV_HEADS, 64)
    cache = torch.zeros(2, 2, 16, NUM_KV_HEADS, 64, dtype=torch.bfloat16)
    ref = cache.clone()
    slots = torch.tensor([0, 17, 5, -1, 31])
    triton_cache.store_kvcache(key, value, cache, slots)
    torch_backend.reshape_and_cache(key, value, ref, slots)
    assert torch.equal(cache, ref)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa_ratio", [1, 4, 8])
def test_decode_matches_reference_on_ragged_contexts(gqa_ratio, head_size, block_size):
    check_forward([1, 1, 1, 1], [1, 17, 40, 67], NUM_KV_HEADS * gqa_ratio, head_size, block_size)


@pytest.mark.parametrize("num_splits", [2, 4])
def test_split_k_decode_matches_reference_including_empty_splits(num_splits):
    # 150 tokens over 2-4 splits of >= 64 tokens: boundaries fall mid-block, and the short
    # sequence leaves every split but the first empty
    cache, meta, q, k, v = make_batch([1, 1, 1], [150, 5, 97], 8, 64, 16, seed=1)
    torch_backend.reshape_and_cache(k, v, cache, meta.slot_mapping)
    out = torch.empty_like(q)
    triton_decode.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 150, 0.125, out, num_splits=num_splits)
    ref = torch_backend.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 150, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_split_k_engages_only_for_long_contexts_with_few_programs(monkeypatch):
    monkeypatch.setattr(triton_decode, "_num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    assert triton_decode.choose_num_splits(1, 8, 8192, cpu) > 1
    assert triton_decode.choose_num_splits(1, 8, 200, cpu) == 1
    assert triton_decode.choose_num_splits(256, 8, 8192, cpu) == 1


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa_ratio", [1, 4, 8])
def test_prefill_matches_reference_for_fresh_and_chunked_sequences(gqa_ratio, head_size, block_size):
    check_forward([9, 21, 12], [9, 21, 45], NUM_KV_HEADS * gqa_ratio, head_size, block_size, seed=2)


def test_prefill_chunks_after_cached_prefix_span_several_query_tiles():
    # chunks start mid-block; 70 and 66 queries need two query tiles at one head per kv group
    check_forward([7, 70, 3, 66], [23, 100, 19, 66], NUM_KV_HEADS, 64, 16, seed=3)


def test_mixed_batch_zeroes_padding_rows_and_skips_padding_slots():
    out, meta = check_forward([1, 1, 5, 9], [30, 4, 5, 40], 8, 64, 16, seed=4, num_padding=3)
    assert torch.all(out[meta.num_actual_tokens :] == 0)


def test_group_size_that_is_not_a_power_of_two_matches_reference():
    check_forward([1, 1, 13, 6], [33, 9, 13, 50], NUM_KV_HEADS * 7, 64, 16, seed=5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_reference_within_output_rounding(dtype):
    check_forward([1, 1, 20], [90, 7, 60], 8, 128, 32, atol=2e-2, dtype=dtype, seed=6)


def test_without_metadata_or_cache_falls_back_to_torch_reference():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(11, h, 64, generator=gen) for h in (4, 2, 2))
    expected = torch_backend.forward(q, k, v, None, None, 0.125)
    assert torch.equal(triton_backend.forward(q, k, v, None, None, 0.125), expected)
    meta = build_attn_metadata([11], [11], [[0]], 16, "cpu")
    assert torch.equal(triton_backend.forward(q, k, v, None, meta, 0.125), expected)


def test_head_size_that_is_not_a_power_of_two_is_rejected():
    with pytest.raises(AssertionError, match="power-of-two head size"):
        triton_backend.TritonAttentionBackend.get_kv_cache_shape(4, 16, 2, 96)


def test_triton_on_cpu_is_allowed_only_under_the_interpreter(monkeypatch):
    assert get_attn_backend("triton", "cpu") is triton_backend.TritonAttentionBackend
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(AttentionBackendUnavailableError, match="TRITON_INTERPRET=1"):
        get_attn_backend("triton", "cpu")


def test_kernels_built_before_the_interpreter_flag_are_reported(monkeypatch):
    monkeypatch.setattr(triton_backend, "kernels_interpreted", lambda: False)
    with pytest.raises(AttentionBackendUnavailableError, match="imported before"):
        get_attn_backend("triton", "cpu")


def test_auto_stays_on_torch_off_cuda_and_flash_attn_requires_cuda():
    assert get_attn_backend("auto", "cpu", block_size=256) is torch_backend.TorchAttentionBackend
    with pytest.raises(AttentionBackendUnavailableError, match="CUDA"):
        get_attn_backend("flash-attn", "cpu")
    with pytest.raises(ValueError, match="flash-attn"):
        get_attn_backend("flash_attention", "cpu")


def test_flash_attn_constraints_name_the_unmet_requirement(monkeypatch):
    monkeypatch.setattr(flash_attn_backend, "IMPORT_ERROR", None)
    assert "multiple of 256" in flash_attn_backend.unsupported_reason(block_size=16)
    assert "float16/bfloat16" in flash_attn_backend.unsupported_reason(512, torch.float32)
    assert "head size" in flash_attn_backend.unsupported_reason(256, torch.bfloat16, 96 + 4)
    assert flash_attn_backend.unsupported_reason(512, torch.bfloat16, 128) is None
