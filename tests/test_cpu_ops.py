"""The fused CPU kernels (layers/cpu_ops) against the torch code they replace: RMS norm with and without
the residual add, q/k norm with rotary embedding, and the SiLU gate; and the cases left to torch.
(tests/test_engine_vs_hf.py checks whole engines with the kernels, and without, against transformers.)"""
from __future__ import annotations

import pytest
import torch

from engine.model_executor.layers import cpu_ops
from engine.model_executor.layers.activation import SiluAndMul
from engine.model_executor.layers.layernorm import RMSNorm, rms_norm
from engine.model_executor.layers.rotary_embedding import RotaryEmbedding

pytestmark = pytest.mark.skipif(cpu_ops.load() is None, reason="no C compiler for the CPU kernels")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def torch_path(monkeypatch):
    monkeypatch.setattr(cpu_ops, "load", lambda: None)


@pytest.mark.parametrize("dim", [512, 40, 7])  # 40, 7: the tail after whole 16-float chunks
def test_rms_norm_matches_the_torch_norm(dim):
    x, w = torch.randn(33, dim, generator=gen()), torch.randn(dim, generator=gen(1))
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6), atol=1e-6, rtol=1e-6)


def test_rms_norm_with_a_residual_leaves_the_sum_in_x_as_the_new_residual_stream(monkeypatch):
    x, res, w = torch.randn(9, 64, generator=gen()), torch.randn(9, 64, generator=gen(1)), torch.randn(64)
    norm = RMSNorm(64)
    norm.weight.data.copy_(w)
    out, stream = norm(x.clone(), res)
    torch_path(monkeypatch)
    ref_out, ref_stream = norm(x.clone(), res)
    assert torch.equal(stream, ref_stream)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)


def test_rms_norm_reads_rows_through_their_stride():
    wide = torch.randn(5, 96, generator=gen())
    x, w = wide[:, :64], torch.randn(64)
    assert not x.is_contiguous()
    torch.testing.assert_close(cpu_ops.rms_norm(x, w, 1e-5), rms_norm(x.contiguous(), w, 1e-5), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dim", [1536, 24])
def test_silu_and_mul_matches_torch(dim):
    x = torch.randn(17, 2 * dim, generator=gen()) * 6
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up, atol=1e-6, rtol=1e-6)


def test_silu_of_huge_gates_is_finite_and_saturates():
    x = torch.tensor([[-1e4, -100.0, 100.0, 1e4, 1.0, 1.0, 1.0, 1.0]])
    out = cpu_ops.silu_and_mul(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([[-0.0, -0.0, 100.0, 1e4]]), atol=1e-30, rtol=0)


def reference_qk(qkv, heads, kv_heads, d, rope, positions, norms, eps):
    qk = qkv[:, : (heads + kv_heads) * d].reshape(-1, heads + kv_heads, d)
    if norms is not None:
        qk = rms_norm(qk, torch.cat([norms[0].expand(heads, -1), norms[1].expand(kv_heads, -1)]), eps)
    qk = rope.rotate(qk, rope.cos_sin(positions))
    return qk[:, :heads].flatten(1), qk[:, heads:].flatten(1)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("shape", [(8, 4, 64, 64), (4, 1, 40, 40), (2, 2, 64, 32)])  # 32 of 64: partial rotary
def test_qk_norm_rope_matches_the_norm_then_the_rotation(qk_norm, shape):
    heads, kv_heads, d, rotary_dim = shape
    rope = RotaryEmbedding(d, rotary_dim, 512, 10000.0)
    qkv = torch.randn(11, (heads + 2 * kv_heads) * d, generator=gen())
    positions = torch.randint(0, 512, (11,), generator=gen(1))
    norms = (torch.randn(d, generator=gen(2)), torch.randn(d, generator=gen(3))) if qk_norm else None
    q, k = cpu_ops.qk_norm_rope(qkv, heads, kv_heads, d, rotary_dim, rope.cos_sin_cache, positions,
                                *(norms or (None, None)), 1e-6)
    ref_q, ref_k = reference_qk(qkv, heads, kv_heads, d, rope, positions, norms, 1e-6)
    torch.testing.assert_close(q, ref_q, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(k, ref_k, atol=2e-6, rtol=1e-6)


def test_a_position_outside_the_rotary_cache_raises_and_writes_nothing():
    rope = RotaryEmbedding(16, 16, 8, 10000.0)
    with pytest.raises(IndexError, match="position out of range"):
        cpu_ops.qk_norm_rope(torch.randn(2, 48), 1, 1, 16, 16, rope.cos_sin_cache, torch.tensor([3, 8]),
                             None, None, 1e-6)


def test_two_threads_give_the_bits_of_one():
    x, res, w = torch.randn(4096, 64, generator=gen()), torch.randn(4096, 64, generator=gen(1)), torch.randn(64)
    g = torch.randn(4096, 96, generator=gen(2))
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            xs = x.clone()
            results.append((cpu_ops.rms_norm(xs, w, 1e-6, res), xs, cpu_ops.silu_and_mul(g)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_are_left_to_torch(dtype):
    x = torch.randn(3, 32).to(dtype)
    assert cpu_ops.rms_norm(x, torch.ones(32, dtype=dtype), 1e-6) is None
    assert cpu_ops.silu_and_mul(x) is None
    assert not cpu_ops.usable(x)


def test_the_kernels_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_NATIVE_KERNELS", "0")
    cpu_ops.load.cache_clear()
    try:
        assert cpu_ops.load() is None
        x = torch.randn(3, 32)
        torch.testing.assert_close(SiluAndMul()(x), torch.nn.functional.silu(x[:, :16]) * x[:, 16:])
    finally:
        cpu_ops.load.cache_clear()


def test_a_change_to_a_shared_header_keys_a_new_build(tmp_path, monkeypatch):
    from engine.model_executor import native_build

    monkeypatch.setattr(native_build, "SHARED_HEADERS", tmp_path)
    (tmp_path / "shared.h").write_text("/* one */")
    before = native_build.library_path(cpu_ops.SOURCE, "cc", ())
    (tmp_path / "shared.h").write_text("/* two */")
    assert native_build.library_path(cpu_ops.SOURCE, "cc", ()) != before
