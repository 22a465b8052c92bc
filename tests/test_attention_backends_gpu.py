"""Triton and flash-attn backends against the torch reference on CUDA, bf16, at realistic sizes."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.model_executor.attention import get_attn_backend, torch_backend
from engine.model_executor.forward_context import build_attn_metadata

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")
NUM_KV_HEADS = 8
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
needs_flash_attn = pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed"
)


def make_batch(query_lens, seq_lens, num_heads, head_size, block_size, dtype=torch.bfloat16, seed=0, num_padding=0):
    """Shuffled block tables, a cache of random garbage that already holds each sequence's context
    (its first seq_len - query_len tokens), and this step's q/k/v (plus `num_padding` junk rows)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    need = [-(-s // block_size) for s in seq_lens]
    perm = torch.randperm(sum(need) + 2, device=DEVICE, generator=gen).tolist()
    tables = [perm[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(need))]
    shape = (2, len(perm), block_size, NUM_KV_HEADS, head_size)
    cache = torch.randn(shape, device=DEVICE, generator=gen).to(dtype)
    context = [s - q for q, s in zip(query_lens, seq_lens)]
    with_ctx = [i for i, c in enumerate(context) if c]
    if with_ctx:
        prefix = build_attn_metadata(
            [context[i] for i in with_ctx], [context[i] for i in with_ctx], [tables[i] for i in with_ctx],
            block_size, DEVICE,
        )
        kv = torch.randn(2, prefix.num_actual_tokens, NUM_KV_HEADS, head_size, device=DEVICE, generator=gen)
        torch_backend.reshape_and_cache(kv[0].to(dtype), kv[1].to(dtype), cache, prefix.slot_mapping)
    meta = build_attn_metadata(query_lens, seq_lens, tables, block_size, DEVICE, num_padding=num_padding)
    total = meta.num_actual_tokens + num_padding
    q = torch.randn(total, num_heads, head_size, device=DEVICE, generator=gen).to(dtype)
    k, v = torch.randn(2, total, NUM_KV_HEADS, head_size, device=DEVICE, generator=gen).to(dtype)
    return cache, meta, q, k, v


def check_backend(backend, query_lens, seq_lens, num_heads, head_size, block_size, atol=2e-2, **kw):
    cache, meta, q, k, v = make_batch(query_lens, seq_lens, num_heads, head_size, block_size, **kw)
    ref_cache = cache.clone()
    scale = head_size**-0.5
    out = backend.forward(q, k, v, cache, meta, scale)
    ref = torch_backend.forward(q, k, v, ref_cache, meta, scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
    assert torch.equal(cache, ref_cache)
    assert torch.all(out[meta.num_actual_tokens :] == 0)


@pytest.fixture(scope="module")
def triton_backend():
    from engine.model_executor.attention import triton_backend as module

    if module.kernels_interpreted():
        pytest.skip("TRITON_INTERPRET is set: these tests are for compiled kernels")
    return get_attn_backend("triton", DEVICE)


# ragged decodes up to ~3k tokens, a fresh 512-token prompt, and a 300-token chunk after a 1000-token prefix
MIXED_QUERY_LENS = [1] * 12 + [512, 300]
MIXED_SEQ_LENS = [1, 7, 16, 33, 100, 255, 256, 257, 1000, 1500, 2048, 3001, 512, 1300]


@needs_triton
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa_ratio", [1, 4, 8])
def test_triton_matches_reference_on_mixed_bf16_batch(triton_backend, gqa_ratio, head_size, block_size):
    check_backend(triton_backend, MIXED_QUERY_LENS, MIXED_SEQ_LENS, NUM_KV_HEADS * gqa_ratio, head_size, block_size,
                  num_padding=5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_matches_reference_in_fp16_and_fp32(triton_backend, dtype):
    atol = 1e-3 if dtype == torch.float32 else 2e-2
    check_backend(triton_backend, MIXED_QUERY_LENS, MIXED_SEQ_LENS, 32, 128, 16, atol=atol, dtype=dtype)


@needs_triton
def test_triton_group_of_seven_matches_reference(triton_backend):
    check_backend(triton_backend, [1, 1, 200, 77], [900, 33, 200, 400], NUM_KV_HEADS * 7, 64, 16)


@needs_triton
def test_triton_store_casts_like_torch_and_skips_padding(triton_backend):
    cache = torch.zeros(2, 64, 16, NUM_KV_HEADS, 128, dtype=torch.bfloat16, device=DEVICE)
    ref = cache.clone()
    slots = torch.randperm(64 * 16, device=DEVICE)[:300]
    slots[::7] = -1
    key, value = torch.randn(2, 300, NUM_KV_HEADS, 128, device=DEVICE)  # fp32 into a bf16 cache
    triton_backend.reshape_and_cache(key, value, cache, slots)
    torch_backend.reshape_and_cache(key, value, ref, slots)
    assert torch.equal(cache, ref)


@needs_triton
def test_triton_split_k_on_8k_contexts_matches_reference_and_single_split(triton_backend):
    from engine.model_executor.attention import triton_decode

    cache, meta, q, k, v = make_batch([1, 1], [8192, 6000], 32, 128, 16, seed=1)
    torch_backend.reshape_and_cache(k, v, cache, meta.slot_mapping)
    assert triton_decode.choose_num_splits(2, NUM_KV_HEADS, 8192, DEVICE) > 1
    split = triton_decode.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 8192, 128**-0.5, torch.empty_like(q))
    single = triton_decode.paged_decode(
        q, cache, meta.block_tables, meta.seq_lens, 8192, 128**-0.5, torch.empty_like(q), num_splits=1
    )
    ref = torch_backend.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 8192, 128**-0.5)
    assert torch.isfinite(split.float()).all()
    torch.testing.assert_close(split.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(split.float(), single.float(), atol=2e-2, rtol=2e-2)


@needs_triton
def test_auto_picks_triton_on_cuda_without_flash_attn_block_sizes():
    assert get_attn_backend("auto", DEVICE, block_size=16).name == "triton"


@needs_flash_attn
@pytest.mark.parametrize("gqa_ratio", [1, 4])
def test_flash_attn_matches_reference_on_mixed_bf16_batch(gqa_ratio):
    backend = get_attn_backend("flash-attn", DEVICE, block_size=256, dtype=torch.bfloat16, head_size=128)
    check_backend(backend, MIXED_QUERY_LENS, MIXED_SEQ_LENS, NUM_KV_HEADS * gqa_ratio, 128, 256, num_padding=5)


@needs_flash_attn
def test_flash_attn_rejects_small_blocks_clearly():
    backend = get_attn_backend("flash-attn", DEVICE)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        backend.get_kv_cache_shape(16, 16, NUM_KV_HEADS, 128)
