"""Mixtures of experts in the simulator: their shapes and KV sizes (MLA included), how expert and data
parallelism shard weights and KV capacity, FP8, the routing model and the bundle's MoE table
(tests/test_data_parallel.py: data-parallel engines and imported layouts)."""
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cost_models import get_cost_model
from sim.cost_models.batch import StepBatch
from sim.cost_models.deployment import Deployment
from sim.cost_models.hardware import get_hardware
from sim.cost_models.kernel_models import bundle_model
from sim.cost_models.kernels import AttentionShape, MoeCall
from sim.cost_models.model_shape import model_shape, rank_shape
from sim.cost_models.profile_bundle import ProfileKernels
from sim.cost_models.roofline import RooflineCostModel
from sim.cost_models.routing import Balanced, Zipf, expected_activated, routing_model

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "llmservingsim_vllm_runs"
QWEN3_MOE = DATA / "models" / "Qwen3-30B-A3B-Instruct-2507.json"
BUNDLE = DATA / "profiles" / "RTXPRO6000" / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
needs_data = pytest.mark.skipif(not BUNDLE.is_dir(), reason="the public MoE profile bundle is not here")

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "max_position_embeddings": 262144, "tie_word_embeddings": False}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "tie_word_embeddings": False}


# ---- shapes ----
def test_qwen3_moe_holds_every_expert_and_each_token_runs_top_k():
    shape = model_shape(QWEN3_30B_A3B)
    assert shape.num_moe_layers == 48
    assert 30.0e9 < shape.total_params < 31.0e9
    assert 2.5e9 < shape.active_params < 3.0e9  # 3.3B active with the embeddings, as Qwen publishes


def test_qwen3_moe_kv_is_k_and_v_per_kv_head():
    assert model_shape(QWEN3_30B_A3B).kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_mlp_only_layers_and_sparse_step_make_dense_layers():
    shape = model_shape({**QWEN3_30B_A3B, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert shape.num_dense_layers == 25  # the 24 odd-step layers and layer 1


def test_deepseek_v3_caches_one_latent_per_token_and_layer():
    shape = model_shape(DEEPSEEK_V3)
    assert shape.kv_bytes_per_token == 61 * (512 + 64) * 2


def test_deepseek_v3_has_dense_leading_layers_and_a_shared_expert():
    shape = model_shape(DEEPSEEK_V3)
    assert (shape.num_dense_layers, shape.num_moe_layers, shape.shared_intermediate) == (3, 58, 2048)
    assert 650e9 < shape.total_params < 700e9  # DeepSeek-V3: 671B


def test_mla_latent_is_replicated_not_split_by_tensor_parallelism():
    shape = model_shape(DEEPSEEK_V3)
    assert rank_shape(shape, 8, expert_parallel=True).kv_bytes_per_token == shape.kv_bytes_per_token


def test_unsupported_mixture_of_experts_is_one_line():
    with pytest.raises(ValueError, match="model_type 'gpt_oss' is not supported"):
        model_shape({**QWEN3_30B_A3B, "model_type": "gpt_oss"})


def test_deepseek_without_its_latent_rank_names_the_field():
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive integer"):
        model_shape({k: v for k, v in DEEPSEEK_V3.items() if k != "kv_lora_rank"})


# ---- sharding, KV capacity, FP8 ----
def test_expert_parallel_divides_the_experts_over_dp_times_tp():
    rank = rank_shape(model_shape(QWEN3_30B_A3B), 1, dp=2, expert_parallel=True)
    assert (rank.num_experts, rank.moe_intermediate, rank.router_experts) == (64, 768, 128)


def test_without_expert_parallel_each_expert_is_split_by_width():
    rank = rank_shape(model_shape(QWEN3_30B_A3B), 1, dp=2)
    assert (rank.num_experts, rank.moe_intermediate) == (128, 384)


def test_expert_and_width_splits_hold_the_same_bytes_per_gpu():
    shape = model_shape(QWEN3_30B_A3B)
    by_experts, by_width = rank_shape(shape, 1, 2, True), rank_shape(shape, 1, 2, False)
    assert by_experts.weight_bytes == by_width.weight_bytes < shape.weight_bytes


def test_experts_that_do_not_split_over_the_ranks_is_one_line():
    with pytest.raises(ValueError, match="128 experts do not split over 3 GPUs"):
        rank_shape(model_shape(QWEN3_30B_A3B), 1, dp=3, expert_parallel=True)


def _blocks(deployment: Deployment, hardware: str = "rtx-pro-6000") -> int:
    model = RooflineCostModel.from_args(model=QWEN3_30B_A3B, hardware=hardware, deployment=deployment)
    return model.num_gpu_blocks(16, 0.9, 2048)


def test_data_parallel_ranks_each_hold_more_kv_than_one_gpu_holding_every_expert():
    assert _blocks(Deployment(data_parallel_size=2, enable_expert_parallel=True)) > 1.5 * _blocks(Deployment())


def test_fp8_kv_cache_holds_twice_the_blocks():
    auto, fp8 = _blocks(Deployment()), _blocks(Deployment(kv_cache_dtype="fp8"))
    assert fp8 in (2 * auto, 2 * auto + 1)


def test_fp8_weights_leave_room_for_more_kv():
    assert _blocks(Deployment(quantization="fp8")) > _blocks(Deployment())


def test_fp8_weights_take_one_byte_each_but_the_embeddings_keep_theirs():
    shape = model_shape(QWEN3_30B_A3B)
    fp8 = Deployment(quantization="fp8").shape(shape)
    embeddings = 2 * shape.head_params * shape.dtype_bytes
    assert fp8.weight_bytes - embeddings == pytest.approx((shape.weight_bytes - embeddings) / 2, rel=1e-3)


def test_fp8_gemms_run_at_twice_the_peak_on_hopper_and_not_on_ampere():
    assert get_hardware("h100").fp8_speedup == 2.0
    assert get_hardware("a100").fp8_speedup == 1.0


def test_unknown_kv_cache_dtype_is_one_line():
    with pytest.raises(ValueError, match="--kv-cache-dtype: must be one of auto, fp8"):
        Deployment(kv_cache_dtype="int4")


# ---- routing ----
def test_one_token_activates_its_top_k():
    assert expected_activated(1, 128, 8) == pytest.approx(8)


def test_many_tokens_activate_every_expert():
    assert expected_activated(4096, 128, 8) == pytest.approx(128)


def test_balanced_routing_splits_experts_and_pairs_evenly_over_ranks():
    activated, share = Balanced().rank_load(64, 128, 8, 2)
    assert activated == pytest.approx(expected_activated(64, 128, 8) / 2) and share == 0.5


def test_zipf_routing_activates_fewer_experts_than_balanced():
    assert Zipf(1.2).rank_load(64, 128, 8, 1)[0] < Balanced().rank_load(64, 128, 8, 1)[0]


def test_zipf_busiest_rank_computes_more_than_its_share():
    assert Zipf(1.2).rank_load(64, 128, 8, 4)[1] > 0.25


def test_zipf_exponent_zero_is_balanced():
    assert Zipf(0.0).rank_load(16, 128, 8, 2)[0] == pytest.approx(Balanced().rank_load(16, 128, 8, 2)[0], rel=1e-6)


def test_bad_routing_is_one_line():
    with pytest.raises(ValueError, match="--routing: balanced, zipf:EXPONENT"):
        routing_model("zipf:steep")


# ---- pricing ----
def test_moe_step_pays_the_experts_its_tokens_activate():
    model = RooflineCostModel.from_args(model=QWEN3_30B_A3B, hardware="h100")
    one, many = (model.breakdown(StepBatch(0, n, 0, n, n * 100, 0.0, [], 100, 100))["moe"] for n in (1, 256))
    assert many > 4 * one  # 8 experts read for one token, all 128 for 256


@needs_data
def test_bundle_moe_table_gives_the_measured_time_at_a_grid_point():
    kernels = ProfileKernels(BUNDLE, 1)
    assert kernels.moe(MoeCall(2048, 128.0)) == pytest.approx(1066.6e-6)
    assert kernels.outside == 0


@needs_data
def test_bundle_moe_below_the_fewest_measured_experts_scales_with_them():
    kernels = ProfileKernels(BUNDLE, 1)
    assert kernels.moe(MoeCall(1, 4.0)) == pytest.approx(kernels.moe(MoeCall(1, 8.0)) / 2)


@needs_data
def test_bundle_without_a_moe_table_refuses_a_mixture_of_experts(tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(BUNDLE, copy, ignore=shutil.ignore_patterns("moe.csv", "skew*.csv"))
    model = bundle_model(copy, str(QWEN3_MOE), None, Deployment(), True)
    with pytest.raises(ValueError, match="no tp1/moe.csv"):
        model.device_time(StepBatch(0, 1, 0, 1, 10, 0.0, [], 10, 10))


@needs_data
def test_bundle_with_a_table_marked_not_run_is_read_without_it_and_says_so(tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(BUNDLE, copy, ignore=shutil.ignore_patterns("skew*.csv", "attention.csv"))
    (copy / "tp1" / "attention.csv").symlink_to(BUNDLE / "tp1" / "attention.csv")
    meta = (copy / "meta.yaml").read_text().replace("skew_fit:\n  enabled: true", "skew_fit:\n  enabled: false")
    (copy / "meta.yaml").write_text(meta.split("  bucket_axes:")[0])
    kernels = ProfileKernels(copy, 1)
    assert kernels.skew_alpha(AttentionShape(0, 0, 8, 1000), 10, 4000) == 0.0
    assert any("skew_fit as not run" in note for note in kernels.describe()["notes"])
    model = bundle_model(copy, str(QWEN3_MOE), None, Deployment(), True)
    assert [n for n in model.describe().notes if "skew_fit" in n] == kernels.caveats()  # printed by sim replay


def test_roofline_moe_weight_read_grows_with_the_activated_experts():
    shape = model_shape(QWEN3_30B_A3B)
    assert shape.weight_read_bytes(1) < shape.weight_read_bytes(64) < shape.weight_read_bytes(4096) + 1
    assert math.isclose(shape.weight_read_bytes(100_000), shape.weight_bytes - shape.head_params * 2, rel_tol=1e-3)


def test_dense_shapes_are_unchanged_by_the_moe_fields():
    dense = model_shape("llama-3.1-8b")
    assert replace(dense, router_experts=0) == dense and not dense.is_moe
    assert dense.active_params == dense.non_embedding_params


def test_aiconfigurator_prices_fp8_weights_from_its_fp8_gemm_tables():
    bf16, fp8 = (get_cost_model("aiconfigurator", model="llama-3.1-8b", hardware="h200",
                                deployment=Deployment(quantization=q)) for q in (None, "fp8"))
    prefill = StepBatch(2048, 0, 1, 0, 2048, 2048 * 1024.5, [(2048, 0)], 0, 0)
    assert fp8.breakdown(prefill)["gate_up_proj"] < 0.8 * bf16.breakdown(prefill)["gate_up_proj"]
    assert fp8.breakdown(prefill)["lm_head"] == bf16.breakdown(prefill)["lm_head"]


def test_roofline_prices_fp8_weights_at_the_fp8_peak():
    bf16, fp8 = (RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100", deployment=Deployment(quantization=q))
                 for q in (None, "fp8"))
    prefill = StepBatch(4096, 0, 1, 0, 4096, 4096 * 2048.5, [(4096, 0)], 0, 0)
    assert fp8.breakdown(prefill)["gate_up_proj"] < 0.6 * bf16.breakdown(prefill)["gate_up_proj"]
