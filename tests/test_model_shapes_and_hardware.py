"""A model's shape and a GPU's figures, the inputs every cost model prices from: tensor-parallel shards of
a model's heads, KV heads, intermediate size and vocabulary; hardware files; model configs given as a
dict, a config.json or a directory. Bad input is one line naming the file and field."""
import json

import pytest

from sim.cli import main
from sim.cost_models.hardware import GB, GiB, TERA, get_hardware, load_hardware_file
from sim.cost_models.kernels import kv_blocks
from sim.cost_models.model_shape import model_shape, rank_shape
from sim_helpers import TINY_WORKLOAD, one_line


# --- tensor-parallel shards -------------------------------------------------------------------------------

def test_rank_shape_divides_heads_kv_heads_intermediate_and_vocab():
    full = model_shape("qwen3-0.6b")  # 16 heads, 8 KV heads, 3072 intermediate, 151936 vocab
    rank = rank_shape(full, 2)
    assert (rank.num_heads, rank.num_kv_heads, rank.intermediate, rank.vocab) == (8, 4, 1536, 75968)
    assert (rank.hidden, rank.num_layers, rank.head_dim) == (full.hidden, full.num_layers, full.head_dim)
    assert rank_shape(full, 1) == full
    odd = model_shape({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1001})
    assert rank_shape(odd, 2).vocab == 501  # ceil: the last rank's shard is padded


def test_kv_heads_fewer_than_ranks_are_replicated_one_per_rank():
    rank = rank_shape(model_shape("qwen3-0.6b"), 16)  # 8 KV heads over 16 GPUs
    assert (rank.num_heads, rank.num_kv_heads, rank.intermediate) == (1, 1, 192)


@pytest.mark.parametrize("cfg, tp, what", [
    ({}, 3, "16 attention heads"),
    ({"num_attention_heads": 24, "num_key_value_heads": 6, "hidden_size": 1536}, 4, "6 KV heads"),
    ({"intermediate_size": 3000}, 16, "3000 intermediate size"),
])
def test_rank_shape_refuses_an_uneven_split_inone_line(cfg, tp, what):
    base = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 1000}
    with pytest.raises(ValueError) as e:
        rank_shape(model_shape({**base, **cfg}), tp)
    text = one_line(e.value)
    assert f"--tensor-parallel-size {tp}" in text and what in text


def test_tp2_ranks_hold_twice_the_kv_tokens_of_one_gpu_and_half_its_weights():
    full, hw = model_shape("llama-3.1-8b"), get_hardware("h100")
    rank = rank_shape(full, 2)
    assert rank.weight_bytes == pytest.approx(full.weight_bytes / 2, rel=0.01)
    assert rank.kv_bytes_per_token * 2 == full.kv_bytes_per_token
    # The same KV memory per GPU holds exactly twice the tokens (each rank keeps half the heads)...
    assert kv_blocks(rank, hw, 16, kv_cache_memory=1 << 30) == 2 * kv_blocks(full, hw, 16, kv_cache_memory=1 << 30)
    # ...and from the GPU's memory a little more than twice, since each rank's weights halve too.
    one, two = kv_blocks(full, hw, 16), kv_blocks(rank, hw, 16)
    assert 2.0 < two / one < 2.5


# --- hardware FILE.yaml -----------------------------------------------------------------------------------

GPU_YAML = {"name": "my-gpu", "bf16_tflops": 400, "memory_bandwidth_tbps": 2.0, "memory_gib": 48, "family": "ada",
            "interconnect": "nvlink", "link_bandwidth_gbps": 100, "link_latency_us": 4}


def _yaml_file(tmp_path, doc, name="gpu.yaml"):
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_hardware_file_gives_a_gpu_with_its_figures(tmp_path):
    path = _yaml_file(tmp_path, {**GPU_YAML, "mfu_eff": 0.5})
    hw = load_hardware_file(path)
    assert (hw.name, hw.family, hw.interconnect) == ("my-gpu", "ada", "nvlink")
    assert hw.peak_flops == pytest.approx(400 * TERA) and hw.hbm_bandwidth == pytest.approx(2.0 * TERA)
    assert hw.memory_bytes == 48 * GiB and hw.link_bandwidth == pytest.approx(100 * GB)
    assert hw.mfu_eff == 0.5
    assert get_hardware(str(path)) == hw


@pytest.mark.parametrize("interconnect", ["nvlink", "pcie"])
def test_a_hardware_file_s_link_latency_is_kept_over_the_interconnect_s_fitted_one(tmp_path, interconnect):
    path = _yaml_file(tmp_path, {**GPU_YAML, "interconnect": interconnect, "link_latency_us": 4})
    assert load_hardware_file(path).link_latency == pytest.approx(4e-6, rel=1e-12)


@pytest.mark.parametrize("change, field", [
    ({"memory_gib": None}, "memory_gib"),
    ({"tensor_cores": 528}, "tensor_cores"),
    ({"bf16_tflops": -400}, "bf16_tflops"),
    ({"interconnect": "infiniband"}, "interconnect"),
])
def test_a_bad_hardware_file_is_a_one_line_error_naming_the_file_and_field(tmp_path, change, field):
    doc = {k: v for k, v in {**GPU_YAML, **change}.items() if v is not None}
    path = _yaml_file(tmp_path, doc)
    with pytest.raises(ValueError) as e:
        load_hardware_file(path)
    text = one_line(e.value)
    assert str(path) in text and field in text


def test_sim_replay_with_a_bad_hardware_file_exits_2(tmp_path, capsys):
    path = _yaml_file(tmp_path, {**GPU_YAML, "interconnect": "infiniband"}, "bad.yaml")
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    rc = main(["replay", str(workload), "--model", "qwen3-0.6b", "--hardware", str(path),
               "--trace", str(tmp_path / "t"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(path) in err and "interconnect" in err


# --- model configs ----------------------------------------------------------------------------------------

CONFIG = {"_name_or_path": "tiny-qwen", "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
          "vocab_size": 1000, "max_position_embeddings": 4096}


def test_a_config_json_file_and_a_directory_holding_one_give_the_dict_s_shape(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    expected = model_shape(CONFIG)
    assert model_shape(str(d / "config.json")) == expected
    assert model_shape(str(d)) == expected
    assert (expected.hidden, expected.num_layers, expected.num_kv_heads, expected.qk_norm) == (256, 4, 2, True)


@pytest.mark.parametrize("change, named", [
    ({"hidden_size": "256"}, "hidden_size"),
    ({"num_hidden_layers": -1}, "num_hidden_layers"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"model_type": "gpt_oss", "num_local_experts": 8}, "gpt_oss"),
    ({"model_type": "mixtral", "num_local_experts": 8}, "num_experts_per_tok"),
])
def test_a_bad_model_config_is_a_one_line_error_naming_the_field_or_type(change, named):
    with pytest.raises(ValueError) as e:
        model_shape({**CONFIG, **change})
    assert named in one_line(e.value)
