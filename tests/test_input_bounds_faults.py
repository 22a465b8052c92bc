"""Every number read from a hardware file, a model config, a workload or a flag is bounded where it is read:
past a generous limit it is one line naming the file (or flag) and the field, never a traceback, a hang, an
overflowed time or an allocation the machine cannot hold."""
import json
import os
import warnings

import pytest
import yaml

from engine.config import EngineArgs
from sim.cli import main as sim_main
from sim.cost_models.hardware import load_hardware_file
from sim.cost_models.model_shape import model_shape
from sim_helpers import TINY_WORKLOAD, one_line
from workloads import WorkloadError, load_workload

# --- hardware FILE.yaml -----------------------------------------------------------------------------------

GPU = {"name": "my-gpu", "bf16_tflops": 400, "memory_bandwidth_tbps": 2.0, "memory_gib": 48}


@pytest.mark.parametrize("field, value", [
    ("memory_gib", 1e300), ("bf16_tflops", 1e300), ("bf16_tflops", 1e-300), ("memory_bandwidth_tbps", 1e-300),
    ("link_bandwidth_gbps", 1e300), ("link_latency_us", 1e300), ("mfu_eff", 1e-300), ("attn_half", 1e300),
    ("kernel_floor", 1e300), ("pointwise_eff", 1e300),
])
def test_hardware_figure_past_any_accelerator_is_one_line_naming_file_and_field(tmp_path, field, value):
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**GPU, field: value}))
    with pytest.raises(ValueError) as e:
        load_hardware_file(path)
    text = one_line(e.value)
    assert str(path) in text and f"{field} must be in [" in text


def test_sim_replay_with_a_hardware_memory_past_any_gpu_exits_2_in_one_line(tmp_path, capsys):
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**GPU, "memory_gib": 1e300}))
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    rc = sim_main(["replay", str(workload), "--model", "llama-3.1-8b", "--hardware", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert str(path) in err and "memory_gib" in err


# --- model config.json ------------------------------------------------------------------------------------

CONFIG = {"_name_or_path": "tiny-qwen", "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
          "vocab_size": 1000, "max_position_embeddings": 4096}


@pytest.mark.parametrize("field, value", [
    ("num_hidden_layers", 10**6), ("hidden_size", 10**30), ("vocab_size", 10**12), ("intermediate_size", 10**12),
    ("head_dim", 10**9), ("max_position_embeddings", 10**30),
])
def test_model_config_size_past_any_model_is_one_line_naming_file_and_field(tmp_path, field, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, field: value}))
    with pytest.raises(ValueError) as e:
        model_shape(str(path))
    text = one_line(e.value)
    assert str(path) in text and f"{field} {value} is more than" in text


def test_model_config_whose_sizes_multiply_past_any_model_is_refused(tmp_path):
    # Each size alone is within its bound; their product is some 5e16 weights.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, "hidden_size": 1 << 20, "num_attention_heads": 1 << 13, "head_dim": 128,
                                "num_key_value_heads": 1 << 13, "num_hidden_layers": 4096,
                                "intermediate_size": 1 << 22}))
    with pytest.raises(ValueError) as e:
        model_shape(str(path))
    text = one_line(e.value)
    assert str(path) in text and "weights, more than" in text


def test_engine_checkpoint_config_past_any_model_is_refused_before_loading(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 10**6}))
    with pytest.raises(ValueError) as e:
        EngineArgs(device="cpu", model=str(tmp_path)).create_engine_config()
    assert "num_hidden_layers 1000000 is more than" in one_line(e.value)


# --- workload YAML ----------------------------------------------------------------------------------------

BASE = {"name": "t", "seed": 1, "num_requests": 50, "arrival": {"process": "poisson", "rate": 2.0},
        "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 4}}


def _bad_workload(tmp_path, field: str, **change) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in {**BASE, **change}.items() if v is not None}))
    with pytest.raises(WorkloadError) as e:
        load_workload(path)
    text = one_line(e.value)
    assert text.startswith(f"{path}: {field}: ")
    return text


@pytest.mark.parametrize("rate", [1e-300, 1e300, float("inf")])
def test_workload_arrival_rate_past_its_bounds_is_refused(tmp_path, rate):
    _bad_workload(tmp_path, "arrival.rate", arrival={"process": "poisson", "rate": rate})


def test_workload_num_requests_past_any_run_is_refused(tmp_path):
    _bad_workload(tmp_path, "num_requests", num_requests=10**12)


def test_workload_duration_past_any_run_is_refused(tmp_path):
    _bad_workload(tmp_path, "duration", num_requests=None, duration=1e300)


def test_workload_duration_whose_rate_makes_too_many_requests_is_refused(tmp_path):
    # Both within bounds alone: 1e6 requests a second for 1e7 s is 1e13 requests, a stream that never ends.
    text = _bad_workload(tmp_path, "duration", num_requests=None, duration=1e7,
                         arrival={"process": "poisson", "rate": 1e6})
    assert "give num_requests or a shorter duration" in text


@pytest.mark.parametrize("cv", [1e-300, 1e300])
def test_workload_gamma_cv_past_its_bounds_is_refused(tmp_path, cv):
    _bad_workload(tmp_path, "arrival.cv", arrival={"process": "gamma", "rate": 1.0, "cv": cv})


@pytest.mark.parametrize("field, on, off", [("arrival.on", 1e-300, 1.0), ("arrival.off", 1.0, 1e308)])
def test_workload_onoff_period_past_its_bounds_is_refused(tmp_path, field, on, off):
    _bad_workload(tmp_path, field, arrival={"process": "onoff", "rate": 1.0, "on": on, "off": off})


@pytest.mark.parametrize("field, dist", [
    ("prompt_tokens.value", {"dist": "fixed", "value": 10**12}),
    ("prompt_tokens.max", {"dist": "uniform", "min": 1, "max": 10**30}),
    ("prompt_tokens.mean", {"dist": "normal", "mean": 1e300, "std": 1.0}),
    ("prompt_tokens.sigma", {"dist": "lognormal", "median": 100, "sigma": 1e300}),
    ("prompt_tokens.a", {"dist": "zipf", "a": 1e300, "min": 2, "max": 10}),
    ("prompt_tokens.weights[0]", {"dist": "empirical", "values": [1, 2], "weights": [1e308, 1e308]}),
])
def test_workload_length_parameter_past_any_context_is_refused(tmp_path, field, dist):
    _bad_workload(tmp_path, field, prompt_tokens=dist)


def test_workload_length_scale_past_its_bounds_is_refused(tmp_path):
    _bad_workload(tmp_path, "length_scale", length_scale=1e300)


def test_workload_prefix_longer_than_any_context_is_refused(tmp_path):
    _bad_workload(tmp_path, "prefix.tokens", prefix={"groups": 2, "tokens": 10**12, "fraction": 0.5})


def test_workload_trace_time_scale_past_its_bounds_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,8,4\n")
    _bad_workload(tmp_path, "arrival.time_scale", num_requests=None, prompt_tokens=None, output_tokens=None,
                  arrival={"process": "trace", "format": "csv", "path": "t.csv", "time_scale": 1e-300})


def test_zipf_lengths_far_from_one_are_drawn_without_nan(tmp_path):
    # k^-a underflows to 0 for every k when min is large; weights relative to min keep the first at 1.
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({**BASE, "num_requests": 2000, "prompt_tokens": {
        "dist": "zipf", "a": 100, "min": 10000, "max": 10100}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value" warning is the NaN weights
        lengths = [r.num_prompt_tokens for r in load_workload(path).requests(max_prompt_tokens=0)]
    assert 10000 <= min(lengths) and max(lengths) <= 10100 and sum(lengths) / len(lengths) < 10045  # weights fall


# --- --time-scale -----------------------------------------------------------------------------------------

def test_workload_requests_refuse_an_infinite_time_scale(tmp_path):
    # Every arrival would be at t = inf: `engine run` would wait for the first one for ever.
    (tmp_path / "w.yaml").write_text(TINY_WORKLOAD)
    with pytest.raises(ValueError) as e:
        load_workload(tmp_path / "w.yaml").requests(time_scale=float("inf"))
    assert one_line(e.value).startswith("--time-scale: must be a finite number")


def test_sim_replay_infinite_time_scale_is_one_line_exit_2(tmp_path, capsys):
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    rc = sim_main(["replay", str(workload), "--time-scale", "inf", "--cost-model", "roofline", "--model",
                   "qwen3-0.6b", "--hardware", "h100", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "--time-scale" in err


# --- the engine's KV cache and threads ----------------------------------------------------------------------

def _machine_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_kv_cache_memory_past_the_machine_s_memory_is_refused_before_allocating():
    with pytest.raises(ValueError) as e:
        EngineArgs(device="cpu", kv_cache_memory=4 * _machine_bytes()).create_engine_config()
    text = one_line(e.value)
    assert text.startswith("kv_cache_memory: ") and "more than the" in text


def test_kv_block_count_past_the_machine_s_memory_is_refused_before_allocating():
    with pytest.raises(ValueError) as e:
        EngineArgs(device="cpu", num_gpu_blocks_override=1 << 26).create_engine_config()
    text = one_line(e.value)
    assert text.startswith("num_gpu_blocks_override: ") and "more than the" in text


def test_engine_cli_kv_cache_past_memory_is_one_line_exit_2(capsys):
    from engine.cli import main as engine_main

    rc = engine_main(["generate", "--device", "cpu", "--kv-cache-memory", str(4 * _machine_bytes()), "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("engine generate: error: --kv-cache-memory: ")


def test_num_threads_past_the_machine_s_cores_is_refused():
    with pytest.raises(ValueError) as e:
        EngineArgs(device="cpu", num_threads=10**9).create_engine_config()
    assert one_line(e.value).startswith("num_threads: ")


@pytest.mark.parametrize("flag", ["--num-gpu-blocks-override", "--max-num-seqs", "--max-num-batched-tokens",
                                  "--block-size"])
def test_sim_replay_scheduler_or_cache_size_past_any_deployment_is_one_line(tmp_path, capsys, flag):
    workload = tmp_path / "w.yaml"
    workload.write_text(TINY_WORKLOAD)
    assert sim_main(["replay", str(workload), "--no-progress", "--trace", str(tmp_path / "t"), flag,
                     str(10**12)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "Traceback" not in err[0], err
