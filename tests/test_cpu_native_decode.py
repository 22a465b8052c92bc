"""The C decode-attention kernel (cpu_native) against the torch reference's gather + SDPA decode, across
head sizes, GQA groups, block sizes and ragged lengths; and its build: cached, and replaced by the torch
path when no compiler is there or the build fails."""
from __future__ import annotations

import subprocess

import pytest
import torch

from engine.model_executor.attention import cpu_decode, cpu_native, torch_backend
from engine.model_executor.forward_context import build_attn_metadata


def make_decodes(seq_lens, num_heads, num_kv_heads, head_size, block_size, seed=0):
    """A filled cache of shuffled blocks, one query token per sequence, and the block tables as the runner
    passes them (int32, padded with 0 to the widest)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 2
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, start = [], 0
    for n in need:
        tables.append(perm[start:start + n])
        start += n
    width = max(need)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=gen)
    q = torch.randn(len(seq_lens), num_heads, head_size, generator=gen)
    return q, cache, table, torch.tensor(seq_lens, dtype=torch.int32)


def reference(q, cache, table, lens, scale):
    return torch_backend.paged_decode(q, cache, table, lens, int(lens.max()), scale)


def native(q, cache, table, lens, scale):
    out = torch.full_like(q, float("nan"))
    cpu_native.paged_decode(q, cache, table, lens, scale, out)
    return out


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """An empty kernel cache and a forgotten load, so `load()` builds again; forgotten again afterwards."""
    monkeypatch.setenv("STEPSCOPE_KERNEL_CACHE", str(tmp_path))
    cpu_native.load.cache_clear()
    yield tmp_path
    cpu_native.load.cache_clear()


def test_the_kernel_builds_with_the_system_compiler():
    assert cpu_native.compiler() is not None
    assert cpu_native.load() is not None


@pytest.mark.parametrize("head_size", [32, 64, 80, 128, 40])  # 40: not a multiple of 16, the scalar loop
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (8, 1), (12, 2)])
def test_matches_the_torch_decode_across_head_sizes_and_gqa_groups(heads, head_size):
    num_heads, num_kv_heads = heads
    q, cache, table, lens = make_decodes([1, 17, 33, 5, 64, 2, 40, 9, 23], num_heads, num_kv_heads, head_size, 16)
    scale = head_size**-0.5
    torch.testing.assert_close(native(q, cache, table, lens, scale), reference(q, cache, table, lens, scale),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 5, 16, 32, 128])
def test_matches_the_torch_decode_across_block_sizes(block_size):
    q, cache, table, lens = make_decodes([1, 3, 31, 32, 33, 130, 7, 64, 65], 8, 2, 64, block_size)
    torch.testing.assert_close(native(q, cache, table, lens, 0.125), reference(q, cache, table, lens, 0.125),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("num_seqs", [1, 2, 5, 40])
@pytest.mark.parametrize("threads", [1, 2])
def test_few_or_many_sequences_on_one_or_two_threads_give_the_same_answer(num_seqs, threads):
    # Few sequences are split by kv head, many go whole; either way on any thread count.
    lens = [1 + (i * 53) % 300 for i in range(num_seqs)]
    q, cache, table, seq_lens = make_decodes(lens, 8, 4, 64, 16)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = native(q, cache, table, seq_lens, 0.125)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, reference(q, cache, table, seq_lens, 0.125), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("head_size", [64, 40])
@pytest.mark.parametrize("block_size", [5, 16])
def test_a_bf16_cache_and_queries_give_the_float32_answer_on_the_same_values(head_size, block_size):
    """The kernel widens bf16 exactly and computes in float32: given a float32 output, it is the float32
    reference over the same (bf16-rounded) values; given a bf16 one, that rounded once."""
    q, cache, table, lens = make_decodes([1, 17, 33, 5, 64, 40], 8, 2, head_size, block_size)
    q16, cache16 = q.to(torch.bfloat16), cache.to(torch.bfloat16)
    expected = reference(q16.float(), cache16.float(), table, lens, 0.125)
    wide = torch.full(q.shape, float("nan"))
    cpu_native.paged_decode(q16, cache16, table, lens, 0.125, wide)
    torch.testing.assert_close(wide, expected, atol=2e-6, rtol=1e-5)
    narrow = torch.full_like(q16, float("nan"))
    cpu_native.paged_decode(q16, cache16, table, lens, 0.125, narrow)
    assert torch.equal(narrow, wide.to(torch.bfloat16))


def test_the_backend_sends_bf16_decodes_to_the_kernel(monkeypatch):
    calls = []
    kernel = cpu_native.paged_decode
    monkeypatch.setattr(cpu_native, "paged_decode", lambda *a: calls.append(a[0].dtype) or kernel(*a))
    cache = torch.randn(2, 12, 16, 2, 32).to(torch.bfloat16)
    meta = build_attn_metadata([1, 1], [20, 35], [[4, 5], [1, 2, 3]], 16, "cpu")
    q, kv = torch.randn(2, 4, 32).to(torch.bfloat16), torch.randn(2, 2, 32).to(torch.bfloat16)
    torch_backend.forward(q, kv, kv, cache, meta, 0.2)
    assert calls == [torch.bfloat16]


def test_a_query_viewed_out_of_a_wider_projection_is_read_through_its_stride():
    # The model's q is a view into [T, q heads + kv heads, d]: rows further apart than heads * d.
    q, cache, table, lens = make_decodes([9, 30, 2], 8, 4, 64, 16)
    wide = torch.randn(3, 12, 64)
    wide[:, :8] = q
    view = wide[:, :8]
    assert not view.is_contiguous()
    torch.testing.assert_close(native(view, cache, table, lens, 0.125), reference(q, cache, table, lens, 0.125),
                               atol=2e-6, rtol=1e-5)


def test_a_huge_score_spread_underflows_to_zero_weight_not_nan():
    q, cache, table, lens = make_decodes([20, 50], 4, 2, 64, 16)
    q *= 400.0
    out = native(q, cache, table, lens, 0.125)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(q, cache, table, lens, 0.125), atol=1e-4, rtol=1e-4)


def test_the_backend_sends_float32_decodes_of_a_mixed_batch_to_the_kernel(monkeypatch):
    calls = []
    kernel = cpu_native.paged_decode
    monkeypatch.setattr(cpu_native, "paged_decode", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))
    cache = torch.randn(2, 12, 16, 2, 32)
    meta = build_attn_metadata([1, 1, 6], [20, 35, 6], [[4, 5], [1, 2, 3], [7]], 16, "cpu")
    q, kv = torch.randn(8, 4, 32), torch.randn(8, 2, 32)
    out = torch_backend.forward(q, kv, kv, cache, meta, 0.2)
    assert calls == [2]
    monkeypatch.setattr(cpu_native, "load", lambda: None)
    torch.testing.assert_close(out, torch_backend.forward(q, kv, kv, cache, meta, 0.2), atol=2e-6, rtol=1e-5)


def test_without_a_compiler_decodes_take_the_torch_path(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert cpu_native.load() is None
    used = []
    torch_path = cpu_decode.paged_decode
    monkeypatch.setattr(cpu_decode, "paged_decode", lambda *a: used.append(1) or torch_path(*a))
    cache = torch.randn(2, 6, 16, 2, 32)
    meta = build_attn_metadata([1, 1], [20, 35], [[4, 5], [1, 2, 3]], 16, "cpu")
    q, kv = torch.randn(2, 4, 32), torch.randn(2, 2, 32)
    torch_backend.forward(q, kv, kv, cache, meta, 0.2)
    assert used == [1]


def test_a_failing_build_leaves_the_kernel_unavailable(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert cpu_native.load() is None
    assert list(fresh_build.iterdir()) == []  # no half-written library left behind


def test_the_kernel_can_be_turned_off(fresh_build, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_NATIVE_KERNELS", "0")
    assert cpu_native.load() is None


def test_a_second_start_loads_the_cached_build_without_compiling(fresh_build, monkeypatch):
    assert cpu_native.load() is not None
    assert len(list(fresh_build.glob("*.so"))) == 1
    cpu_native.load.cache_clear()

    def no_compiler(*args, **kwargs):
        raise AssertionError("the cached build must be loaded, not rebuilt")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert cpu_native.load() is not None
