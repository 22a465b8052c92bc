"""Weight loading: safetensors layouts, seeded dummy weights, clear errors, preset shapes and KV sizing."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from engine.model_executor.loader import (
    build_model,
    kv_bytes_per_block,
    kv_cache_spec,
    load_model,
    safetensors_files,
)
from engine.model_executor.models import get_model_class
from engine.model_executor.presets import PRESETS, get_preset, hf_config_from_dict

DEVICE = torch.device("cpu")


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=512, max_position_embeddings=128)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config())
    single = tmp_path_factory.mktemp("single")
    model.save_pretrained(single)
    return model, single


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_sharded_checkpoint_loads_equal_to_single_file(tiny_llama, tmp_path):
    hf, single = tiny_llama
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    a = state(load_model(hf.config, single, "safetensors", torch.float32, DEVICE))
    b = state(load_model(hf.config, tmp_path, "safetensors", torch.float32, DEVICE))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    q_ref = hf.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(b["model.layers.1.self_attn.qkv_proj.weight"][: q_ref.shape[0]], q_ref)


def test_checkpoint_dtype_is_cast_to_requested_dtype(tiny_llama):
    hf, single = tiny_llama
    model = load_model(hf.config, single, "safetensors", torch.bfloat16, DEVICE)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        logits = model.compute_logits(model(torch.tensor([1, 2, 3]), torch.arange(3)))
    assert logits.dtype == torch.float32


def test_checkpoint_missing_a_weight_is_reported(tiny_llama, tmp_path):
    hf, single = tiny_llama
    tensors = load_file(single / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="gate_up_proj"):
        load_model(hf.config, tmp_path, "safetensors", torch.float32, DEVICE)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_refused_naming_the_tensor(tiny_llama, tmp_path, bad):
    hf, single = tiny_llama
    tensors = load_file(single / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"][0, 0] = bad
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="up_proj.weight holds NaN or infinite"):
        load_model(hf.config, tmp_path, "safetensors", torch.float32, DEVICE)


def test_dummy_weights_are_deterministic_per_seed():
    config = tiny_llama_config()
    a = state(load_model(config, None, "dummy", torch.float32, DEVICE, seed=0))
    b = state(load_model(config, None, "dummy", torch.float32, DEVICE, seed=0))
    c = state(load_model(config, None, "dummy", torch.float32, DEVICE, seed=1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.self_attn.qkv_proj.weight"], c["model.layers.0.self_attn.qkv_proj.weight"])
    assert all(torch.all(v == 1) for k, v in a.items() if "norm" in k)


def test_dummy_weights_give_finite_moderate_logits():
    model = load_model(hf_config_from_dict(get_preset("qwen3-0.6b") | {"num_hidden_layers": 2}),
                       None, "dummy", torch.bfloat16, DEVICE)
    with torch.no_grad():
        logits = model.compute_logits(model(torch.arange(8), torch.arange(8)))
    assert torch.isfinite(logits).all()
    assert 0.1 < logits.std().item() < 10


def test_missing_model_dir_error_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(tiny_llama_config(), missing, "safetensors", torch.float32, DEVICE)


def test_dir_without_safetensors_names_expected_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tiny_llama_config(), tmp_path, "safetensors", torch.float32, DEVICE)


def test_unknown_load_format_is_rejected():
    with pytest.raises(ValueError, match="pt"):
        load_model(tiny_llama_config(), None, "pt", torch.float32, DEVICE)


def test_unsupported_architecture_error_names_it_and_lists_supported():
    config = tiny_llama_config()
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load_model(config, None, "dummy", torch.float32, DEVICE)
    with pytest.raises(ValueError, match="MistralForCausalLM"):
        get_model_class("MistralForCausalLM")


@pytest.mark.parametrize("name, billions", [("llama-3.1-8b", 8.03), ("qwen3-0.6b", 0.596), ("qwen2.5-7b", 7.62)])
def test_preset_parameter_count_matches_public_size(name, billions):
    model = build_model(hf_config_from_dict(get_preset(name)), torch.bfloat16, "meta")
    count = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert all(p.is_meta for p in model.parameters())
    assert abs(count / 1e9 - billions) / billions < 0.02


def test_llama_preset_keeps_its_llama3_rope_scaling():
    config = hf_config_from_dict(get_preset("llama-3.1-8b"))
    model = build_model(config, torch.bfloat16, "meta")
    assert type(model).__name__ == "LlamaForCausalLM"
    params = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert params["rope_type"] == "llama3" and params["factor"] == 8.0


def test_unknown_preset_error_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_preset("gpt-5")
    assert all(name in str(err.value) for name in PRESETS)


def test_kv_bytes_per_block_counts_k_and_v_over_all_layers():
    spec = kv_cache_spec(hf_config_from_dict(get_preset("llama-3.1-8b")))
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size) == (32, 8, 128)
    assert kv_bytes_per_block(spec, 16, torch.bfloat16) == 2 * 32 * 16 * 8 * 128 * 2
    assert kv_bytes_per_block(spec, 32, torch.float32) == 4 * kv_bytes_per_block(spec, 16, torch.bfloat16)


def _index_naming(tmp_path, shard: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))


@pytest.mark.parametrize("shard,why", [("/etc/passwd", "absolute path"), ("../outside.safetensors", "'..'"),
                                       ("sub/../../outside.safetensors", "'..'")])
def test_shard_outside_the_model_directory_is_refused_naming_index_and_shard(tmp_path, shard, why):
    _index_naming(tmp_path, shard)
    with pytest.raises(ValueError, match="model.safetensors.index.json: shard") as err:
        safetensors_files(tmp_path)
    assert repr(shard) in str(err.value) and why in str(err.value)


def test_shard_symlink_escaping_the_model_directory_is_refused(tmp_path):
    model_dir, outside = tmp_path / "model", tmp_path / "elsewhere.safetensors"
    model_dir.mkdir()
    save_file({"x": torch.zeros(1)}, outside)
    (model_dir / "model-00001.safetensors").symlink_to(outside)
    _index_naming(model_dir, "model-00001.safetensors")
    with pytest.raises(ValueError, match="shard 'model-00001.safetensors' is a symlink to .*outside the model"):
        safetensors_files(model_dir)


def test_shard_symlink_into_the_hugging_face_cache_blobs_is_accepted(tmp_path):
    snapshot, blobs = tmp_path / "snapshots" / "abc123", tmp_path / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    save_file({"x": torch.zeros(1)}, blobs / "f00d")
    (snapshot / "model-00001.safetensors").symlink_to("../../blobs/f00d")
    _index_naming(snapshot, "model-00001.safetensors")
    assert safetensors_files(snapshot) == [snapshot / "model-00001.safetensors"]


def test_index_without_weight_map_is_one_clear_error(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ValueError, match="index.json: needs a 'weight_map' object"):
        safetensors_files(tmp_path)
