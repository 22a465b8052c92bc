"""The CPU engine's fast paths: prefill attention on SDPA's flash kernel, oneDNN-packed linears that
compute what nn.Linear computes, and OpenMP spin-waiting bounded where an engine is built, before torch
loads (never by an import)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.config import OPENMP_SPIN_COUNT, bound_openmp_spin
from engine.model_executor.attention import cpu_decode
from engine.model_executor.attention.torch_backend import forward, reshape_and_cache
from engine.model_executor.forward_context import build_attn_metadata
from engine.model_executor.layers import cpu_linear
from engine.model_executor.layers.cpu_linear import (Packing, PackedLinear, UpcastLinear, onednn_packing_available,
                                                     pack_linears)

needs_onednn = pytest.mark.skipif(not onednn_packing_available(), reason="torch built without oneDNN")


def test_prefill_with_and_without_cached_context_runs_on_the_flash_kernel():
    # Only the flash kernel allowed: the math fallback (3-D inputs did that) would raise instead.
    block_size, kv_heads, heads, d = 16, 2, 4, 32
    query_lens, seq_lens, tables = [1, 40, 24], [30, 40, 56], [[1, 2], [3, 4, 5], [6, 7, 8, 9]]
    cache = torch.zeros(2, 10, block_size, kv_heads, d)
    gen = torch.Generator().manual_seed(0)
    ctx = build_attn_metadata([29, 32], [29, 32], [tables[0], tables[2]], block_size, "cpu")
    reshape_and_cache(torch.randn(61, kv_heads, d, generator=gen), torch.randn(61, kv_heads, d, generator=gen),
                      cache, ctx.slot_mapping)
    meta = build_attn_metadata(query_lens, seq_lens, tables, block_size, "cpu")
    q = torch.randn(65, heads, d, generator=gen)
    k, v = torch.randn(65, kv_heads, d, generator=gen), torch.randn(65, kv_heads, d, generator=gen)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = forward(q, k, v, cache, meta, d**-0.5)
    assert out.shape == q.shape and torch.isfinite(out).all()


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_nn_linear_on_2d_and_3d_inputs(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias)
    packed = PackedLinear(linear, batch_size_hint=8)
    for x in (torch.randn(5, 96), torch.randn(3, 7, 96)):
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_pack_linears_swaps_every_linear_and_nothing_else():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4), nn.LayerNorm(4)))
    assert pack_linears(model, batch_size_hint=4) == Packing(packed=2, upcast=0)
    assert [type(m).__name__ for m in model.modules()] == [
        "Sequential", "PackedLinear", "ReLU", "Sequential", "PackedLinear", "LayerNorm"]


@needs_onednn
def test_a_linear_onednn_cannot_pack_multiplies_in_float32_and_is_counted(monkeypatch):
    """bf16 on a CPU without AVX-512 or AVX-NE-CONVERT: oneDNN refuses the reorder."""
    def refuse(weight, hint):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(cpu_linear.torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    model = nn.Sequential(nn.Linear(8, 16).to(torch.bfloat16), nn.ReLU())
    assert pack_linears(model, batch_size_hint=4) == Packing(packed=0, upcast=1)
    assert type(model[0]) is UpcastLinear and model[0].weight.dtype == torch.bfloat16


def test_upcast_linear_gives_a_bf16_gemm_with_float32_accumulation():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    x = torch.randn(5, 64).to(torch.bfloat16)
    exact = (x.double() @ linear.weight.double().T + linear.bias.double()).to(torch.bfloat16)
    out = UpcastLinear(linear)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, exact, atol=0, rtol=2 ** -7)


@pytest.fixture
def no_wait_policy(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    return monkeypatch


def test_spin_is_bounded_when_torch_is_not_loaded_yet(no_wait_policy):
    no_wait_policy.delitem(sys.modules, "torch")
    assert bound_openmp_spin() is True
    assert os.environ["GOMP_SPINCOUNT"] == OPENMP_SPIN_COUNT


def test_a_wait_policy_the_user_chose_is_left_alone(no_wait_policy):
    no_wait_policy.delitem(sys.modules, "torch")
    no_wait_policy.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert bound_openmp_spin() is True
    assert "GOMP_SPINCOUNT" not in os.environ


def test_too_late_once_torch_is_loaded(no_wait_policy):
    assert bound_openmp_spin() is False
    assert "GOMP_SPINCOUNT" not in os.environ


def test_importing_the_engine_config_sets_nothing():
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import os, engine.config, engine.entrypoints.llm; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


class _EngineBuilt(Exception):
    """Raised by a stand-in for the engine's construction, after noting what the environment held."""


def _note_spin_count(seen: list):
    def stand_in(*args, **kwargs):
        seen.append(("torch" in sys.modules, os.environ.get("GOMP_SPINCOUNT")))
        raise _EngineBuilt
    return stand_in


def test_an_llm_bounds_spin_before_its_engine_loads_torch(no_wait_policy):
    from engine.entrypoints import llm

    seen: list = []
    no_wait_policy.delitem(sys.modules, "torch")
    no_wait_policy.setattr(llm.LLMEngine, "from_engine_args", _note_spin_count(seen))
    with pytest.raises(_EngineBuilt):
        llm.LLM()
    assert seen == [(False, OPENMP_SPIN_COUNT)]


def test_engine_run_bounds_spin_before_it_loads_torch(no_wait_policy):
    from engine import config
    from engine.cli import build_parser
    from engine.run import main_run

    seen: list = []
    no_wait_policy.delitem(sys.modules, "torch")
    no_wait_policy.setattr(config, "resolve_device", _note_spin_count(seen))  # the first to load torch
    with pytest.raises(_EngineBuilt):
        main_run(build_parser().parse_args(["run"]))
    assert seen == [(False, OPENMP_SPIN_COUNT)]


def test_decode_index_names_each_heads_kv_rows_through_the_block_table():
    block_size, heads, kv_heads = 4, 6, 2
    tables = torch.tensor([[7, 3, 0], [2, 9, 5]], dtype=torch.int32)
    lens = [6, 11]
    index = cpu_decode.build_decode_index(tables, lens, block_size, heads, kv_heads)
    expected = []
    for table, n in zip(tables.tolist(), lens):
        for h in range(heads):
            expected += [(table[p // block_size] * block_size + p % block_size) * kv_heads + h // 3 for p in range(n)]
    assert index.cols.tolist() == expected
    assert index.crow.tolist() == [0] + torch.tensor([n for n in lens for _ in range(heads)]).cumsum(0).tolist()
    assert index.max_len == 11
    assert index.grid_pos.tolist() == [r * 11 + p for r, n in enumerate(n for n in lens for _ in range(heads))
                                       for p in range(n)]


def test_without_the_c_kernel_float32_cpu_decodes_read_the_cache_in_place_and_share_one_index(monkeypatch):
    from engine.model_executor.attention import cpu_native, torch_backend

    monkeypatch.setattr(cpu_native, "load", lambda: None)  # the torch path, as where no compiler is found

    def gathered(*args, **kwargs):
        raise AssertionError("float32 CPU decodes must not gather their blocks")

    monkeypatch.setattr(torch_backend, "paged_decode", gathered)
    gen = torch.Generator().manual_seed(1)
    cache = torch.randn(2, 12, 16, 2, 32, generator=gen)
    meta = build_attn_metadata([1, 1], [20, 35], [[4, 5], [1, 2, 3]], 16, "cpu")
    q, kv = torch.randn(2, 4, 32, generator=gen), torch.randn(2, 2, 32, generator=gen)
    first = forward(q, kv, kv, cache, meta, 0.2)
    index = meta.decode_index
    second = forward(q, kv, kv, cache, meta, 0.2)  # a second layer of the same step
    assert meta.decode_index is index
    torch.testing.assert_close(first, second)


def test_a_long_prefill_mlp_in_row_passes_matches_one_pass(monkeypatch):
    from engine.model_executor.models import llama

    torch.manual_seed(0)
    mlp = llama.LlamaMLP(32, 48, bias=False)
    x = torch.randn(37, 32)
    with torch.inference_mode():
        whole = mlp(x)
        monkeypatch.setattr(llama, "CPU_MLP_ROWS", 8)  # 37 rows: four passes of 8 and one of 5
        # To float32 rounding, not to the bit: the GEMM may block or split a 5-row pass differently
        # from a 37-row one (seen off by 4e-8); a misplaced row would be off by the whole value.
        torch.testing.assert_close(mlp(x), whole, atol=1e-6, rtol=1e-5)


def test_rms_norm_rounds_as_transformers_does():
    from engine.model_executor.layers.layernorm import RMSNorm, rms_norm

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5, 3, 64, generator=gen).to(dtype)
        weight = (1 + 0.1 * torch.randn(3, 64, generator=gen)).to(dtype)
        xf = x.float()
        expected = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        assert torch.equal(rms_norm(x, weight, 1e-6), expected)
    norm = RMSNorm(64)
    x, residual = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    total = x + residual
    normed, new_residual = norm(x.clone(), residual)
    assert torch.equal(new_residual, total) and torch.equal(normed, norm(total))


def test_rotary_rotation_rounds_as_rotate_half_does():
    from engine.model_executor.layers.rotary_embedding import RotaryEmbedding

    rope = RotaryEmbedding(64, 64, 512, 10000.0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 64, generator=gen)
    positions = torch.tensor([0, 3, 17, 200, 201, 511])
    cos, sin = rope.cos_sin_cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    rotate_half = torch.cat([-x[..., 32:], x[..., :32]], dim=-1)
    assert torch.equal(rope.rotate(x, rope.cos_sin(positions)), x * cos + rotate_half * sin)
