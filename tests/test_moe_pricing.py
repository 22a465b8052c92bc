"""A sparse layer's MoE block priced from AIConfigurator's measured vLLM MoE table
(`AIConfiguratorKernels.moe`), and held against the kernel-profile bundle measured for the same expert
shape on the same GPU (Qwen3-30B-A3B on an RTX PRO 6000: hidden 2048, experts 768 wide, top-8 of 128)."""
from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cost_models.kernels import MoeCall
from sim.cost_models.model_shape import model_shape, rank_shape, with_dtypes
from sim.cost_models.routing import Zipf, expected_activated

pytestmark = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                reason="aiconfigurator-core is not installed")

REPO = Path(__file__).resolve().parent.parent
BUNDLE = Path("profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
RUNS = (REPO / "bench/data/llmservingsim_vllm_runs",)
TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SHAPE = {"hidden_size": 2048, "inter_size": 768, "topk": 8, "num_experts": 128, "moe_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def table():
    """{(moe_tp, moe_ep, distribution): {tokens: seconds}} of the Qwen3-30B-A3B expert shape, bf16."""
    from sim.cost_models import aic_tables

    path = aic_tables.table_file(aic_tables.package_root(), "rtx_pro_6000_server", "moe")[1]
    df = aic_tables.read_table(str(path))
    for column, value in SHAPE.items():
        df = df[df[column] == value]
    out: dict = {}
    for row in df.itertuples():
        out.setdefault((row.moe_tp_size, row.moe_ep_size, row.distribution), {})[row.num_tokens] = row.latency * 1e-3
    return out


def kernels(ep: int = 1, routing=None, shape=None):
    from sim.cost_models.aiconfigurator import AIConfiguratorKernels

    return AIConfiguratorKernels(rank_shape(shape or model_shape("qwen3-30b-a3b"), 1, ep, ep > 1), "rtx-pro-6000",
                                 routing=routing)


def fused(k, call: MoeCall) -> float:
    """The block less its router GEMM and top-k kernel: the fused experts as the table prices them."""
    return k.moe(call) - k.gemm(128, 2048)(call.tokens) - k._streaming_constants()[0]


def test_every_expert_activated_at_a_grid_point_is_the_measured_time(table):
    assert fused(kernels(), MoeCall(256, 128)) == pytest.approx(table[(1, 1, "balanced")][256], rel=1e-9)


def test_ep2_rank_reads_the_ep2_rows(table):
    assert fused(kernels(ep=2), MoeCall(256, 64, 0.5)) == pytest.approx(table[(1, 2, "balanced")][256], rel=1e-9)


def test_ep2_rank_is_faster_than_one_gpu_holding_every_expert():
    assert kernels(ep=2).moe(MoeCall(256, 64, 0.5)) < 0.7 * kernels().moe(MoeCall(256, 128))


def test_balanced_rows_scale_with_the_calls_distinct_experts(table):
    # The table's balanced routing activates min(8 x 8, 128) = 64 experts at 8 tokens.
    assert fused(kernels(), MoeCall(8, 32)) == pytest.approx(table[(1, 1, "balanced")][8] / 2, rel=1e-9)


def test_zipf_routing_reads_the_nearest_power_law_rows_unscaled(table):
    k = kernels(routing=Zipf(1.3))
    assert fused(k, MoeCall(256, 100)) == pytest.approx(table[(1, 1, "power_law_1.2")][256], rel=1e-9)
    assert "power_law_1.2" in k.notes["moe routing zipf:1.3"]


def test_fp8_weights_read_the_fp8_rows():
    k = kernels(shape=with_dtypes(model_shape("qwen3-30b-a3b"), quantization="fp8"))
    k.moe(MoeCall(64, 128))
    assert k.describe()["moe"]["moe_tp 1 x moe_ep 1"]["dtype"] == "fp8"


def test_moe_time_never_falls_with_more_tokens(table):
    k = kernels()
    times = [fused(k, MoeCall(n, min(8 * n, 128))) for n in sorted(table[(1, 1, "balanced")])]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:]))


def test_tokens_past_the_moe_grid_count_as_outside():
    k = kernels()
    k.moe(MoeCall(16384, 128))
    assert k.outside == 0
    k.moe(MoeCall(32768, 128))
    assert k.outside == 1


def test_expert_shape_without_a_table_gives_one_line_listing_the_measured_ones():
    shape = replace(model_shape("qwen3-30b-a3b"), num_experts=64, router_experts=64, top_k=4)
    with pytest.raises(ValueError) as e:
        kernels(shape=shape).moe(MoeCall(8, 16))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("--hardware rtx-pro-6000: AIConfigurator's vLLM 0.24.0 MoE table for "
                              "rtx_pro_6000_server has no bfloat16 rows for hidden 2048, expert width 768, top-4 of "
                              "64 experts; measured (hidden/width/top-k/experts): 2048/512/8/256, 2048/768/8/128")


def test_unmeasured_expert_split_gives_one_line_listing_the_measured_ones():
    shape = replace(model_shape("qwen3-30b-a3b"), moe_intermediate=256)
    with pytest.raises(ValueError, match=r"^--hardware rtx-pro-6000: .* has no moe_tp 3 x moe_ep 1 rows for hidden "
                                         r"2048, expert width 768, top-8 of 128 experts; measured \(moe_tp x moe_ep\): "
                                         r"1x1, 1x2, .*, 32x1$"):
        kernels(shape=shape).moe(MoeCall(8, 51.6, 1.0, 3))


def test_gpu_without_a_moe_table_gives_one_line_naming_those_with_one():
    k = kernels()
    del k.files["moe"]
    with pytest.raises(ValueError, match=r"^--hardware rtx-pro-6000: AIConfigurator \S+ has no vLLM MoE table for "
                                         r"rtx_pro_6000_server; GPUs with one: a100, b200, h100, h200, l40s, "
                                         r"rtx-pro-6000$"):
        k.moe(MoeCall(8, 64))


# --- the bundle's moe.csv against AIConfigurator's table, at the bundle's balanced expectation ---------


@pytest.fixture(scope="module")
def both():
    """(bundle, AIConfigurator) seconds of one MoE block at TOKENS, experts at their balanced expectation."""
    from sim.cost_models.profile_bundle import ProfileKernels

    bundle = next((root / BUNDLE for root in RUNS if (root / BUNDLE / "tp1" / "moe.csv").is_file()), None)
    if bundle is None:
        pytest.skip(f"no {BUNDLE}/tp1/moe.csv under {' or '.join(map(str, RUNS))}")
    profile, aic = ProfileKernels(bundle, 1), kernels()
    calls = [MoeCall(n, expected_activated(n, 128, 8)) for n in TOKENS]
    return [profile.moe(c) for c in calls], [aic.moe(c) for c in calls]


def test_bundle_and_aiconfigurator_agree_within_2_percent_up_to_1024_tokens(both):
    bundle, aic = both
    ratios = [b / a for b, a, n in zip(bundle, aic, TOKENS) if n <= 1024]
    assert max(abs(r - 1) for r in ratios) < 0.02, ratios


def test_bundle_and_aiconfigurator_agree_within_8_percent_at_2048_tokens(both):
    bundle, aic = both
    assert abs(bundle[-1] / aic[-1] - 1) < 0.08
