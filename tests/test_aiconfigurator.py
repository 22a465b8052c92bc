"""Kernel times from AIConfigurator's measured vLLM tables (sim.cost_models.aiconfigurator)."""
from __future__ import annotations

import importlib.util
from functools import cache

import pandas as pd
import pytest

from sim.cost_models import aic_extract
from sim.cost_models import aiconfigurator as aic
from sim.cost_models.kernels import AttentionShape
from sim.cost_models.model_shape import model_shape

H100 = "systems/data/h100_sxm/{}/vllm/0.24.0/{}.parquet"
GPUS = ("h100", "h200", "b200", "a100", "l40s", "rtx-pro-6000")
KINDS = ("gemm", "decode_attention", "context_attention")


@cache
def table(family: str, stem: str) -> pd.DataFrame:
    return pd.read_parquet(aic.package_root() / H100.format(family, stem))


def llama_h100() -> aic.AIConfiguratorKernels:
    return aic.AIConfiguratorKernels(model_shape("llama-3.1-8b"), "h100")


def qkv_ms(m: int) -> float:
    """Llama-3.1-8B's QKV projection (n = (32 + 2 * 8) * 128, k = 4096) as the bf16 table measured it."""
    g = table("gemm", "gemm_perf")
    row = g[(g.gemm_dtype == "bfloat16") & (g.n == 6144) & (g.k == 4096) & (g.m == m)]
    assert len(row) == 1
    return float(row.latency.iloc[0])


def test_decode_gemm_at_a_grid_point_is_the_measured_time():
    assert llama_h100().dense("qkv_proj", 8) == pytest.approx(qkv_ms(8) * 1e-3, rel=1e-12)


def test_decode_gemm_between_grid_points_lies_between_its_neighbours():
    low, high = sorted((qkv_ms(17) * 1e-3, qkv_ms(32) * 1e-3))
    t = llama_h100().dense("qkv_proj", 20)
    assert low <= t <= high
    assert t not in (low, high)


def test_decode_attention_at_a_grid_point_is_the_measured_time():
    g = table("attention", "generation_attention_perf")
    row = g[(g.kernel_source == "vllm_flash_attn_fa3") & (g.batch_size == 128) & (g.step == 1023)
            & (g.num_heads == 32) & (g.num_key_value_heads == 8) & (g.head_dim == 128) & (g.window_size == 0)
            & (g.kv_cache_dtype == "bfloat16")]
    assert len(row) == 1
    assert llama_h100().attention(AttentionShape(0, 0, 128, 1023)) == pytest.approx(row.latency.iloc[0] * 1e-3,
                                                                                    rel=1e-12)


def test_mixed_batch_attention_is_prefill_plus_decode():
    k = llama_h100()
    mixed = k.attention(AttentionShape(512, 256, 64, 2000))
    assert mixed == pytest.approx(k.attention(AttentionShape(512, 256, 0, 0)) + k.attention(AttentionShape(0, 0, 64, 2000)))


def test_tokens_past_the_gemm_grid_count_as_outside():
    k = llama_h100()
    k.dense("o_proj", 8192)
    assert k.outside == 0
    k.dense("o_proj", 65536)
    assert k.outside == 1


def test_unknown_hardware_gives_one_line_listing_what_is_available():
    with pytest.raises(ValueError) as e:
        aic.AIConfiguratorKernels(model_shape("llama-3.1-8b"), "rtx-4090")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("--hardware rtx-4090:")
    assert message.endswith("available: a100, b200, h100, h200, l40s, rtx-pro-6000")


def test_missing_package_asks_for_the_aic_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiconfigurator_core"
                        else real(name, *a))
    with pytest.raises(ValueError, match=r"^--cost-model aiconfigurator: needs the aic extra \(pip install "
                                         r"'stepscope\[aic\]'\)$"):
        aic.AIConfiguratorKernels(model_shape("llama-3.1-8b"), "h100")


def test_all_reduce_over_an_unmeasured_degree_is_none():
    assert llama_h100().all_reduce_time(1 << 20, 3) is None


def test_all_reduce_at_a_measured_size_is_the_cuda_graph_time():
    g = table("comm", "custom_allreduce_perf")
    row = g[(g.num_gpus == 2) & (g.kernel_source == "vLLM_custom_graph") & (g.message_size == 1 << 19)]
    assert len(row) == 1
    assert llama_h100().all_reduce_time(2 << 19, 2) == pytest.approx(row.latency.iloc[0] * 1e-3, rel=1e-12)


def test_extract_has_rows_for_each_gpu_and_kernel_kind():
    rows = aic_extract.load_extract()
    assert {(r["gpu"], r["kernel"]) for r in rows} >= {(g, k) for g in GPUS for k in KINDS}
    assert all(r["time_us"] > 0 and r["table"].endswith(".parquet") for r in rows)


def allreduce_times(gpu: str, tp: int) -> dict[str, list[tuple[int, float]]]:
    """{vLLM version: [(message bytes, us)] sorted by size} of the all-reduce extract."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in aic_extract.load_extract(aic_extract.ALLREDUCE_FILE):
        if r["gpu"] == gpu and r["tp"] == tp:
            out.setdefault(r["vllm_version"], []).append((r["message_bytes"], r["time_us"]))
    return {v: sorted(points) for v, points in out.items()}


@pytest.mark.parametrize("gpu", ["rtx-pro-6000", "h100"])
def test_allreduce_extract_has_two_gpu_rows(gpu):
    assert allreduce_times(gpu, 2)


@pytest.mark.parametrize("gpu", ["rtx-pro-6000", "h100"])
def test_allreduce_extract_time_grows_with_message_size(gpu):
    growing = {version: len(points) > 1 and all(b[1] > a[1] for a, b in zip(points, points[1:]))
               for version, points in allreduce_times(gpu, 2).items()}
    assert growing and all(growing.values()), growing


def test_allreduce_extract_row_is_what_the_cost_model_prices():
    nbytes, us = allreduce_times("h100", 2)["0.24.0"][4]
    assert llama_h100().all_reduce_time(nbytes, 2) == pytest.approx(us * 1e-6, rel=0, abs=0.5e-4 * 1e-6)  # 4 decimals
