"""What a vLLM run's recorded engine arguments leave unset, filled in as that vLLM version ran it: each
default with the file and line in vLLM's own source where it is set, so an imported run's meta says which
settings were recorded and which inferred, and from where."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.errors import WorkloadError

# vLLM 0.19.0's defaults for what a run's engine_kwargs leave unset, under engine.core's names, each with
# where vLLM sets it (files of the vllm package at tag v0.19.0). A bool value of async scheduling holds only
# for the executors that support it (one process, or multiprocessing on one node).
VLLM_DEFAULTS: dict[str, dict[str, dict[str, tuple[Any, str]]]] = {
    "0.19.0": {
        "scheduler": {
            "enable_chunked_prefill": (
                True, "vllm/engine/arg_utils.py:2113 from ModelConfig.is_chunked_prefill_supported "
                "(vllm/config/model.py:1737: true for decoder-only generative models)"),
            "long_prefill_token_threshold": (
                0, "vllm/config/scheduler.py:79; raised only when max_num_partial_prefills > 1, whose default is 1 "
                "(vllm/config/scheduler.py:69, 244)"),
            "policy": ("fcfs", "vllm/config/scheduler.py:108 and EngineArgs.scheduling_policy "
                               "(vllm/engine/arg_utils.py:569)"),
            "scheduler_reserve_full_isl": (
                True, "vllm/config/scheduler.py:139, read at vllm/v1/core/sched/scheduler.py:733: a request is "
                "admitted only when its whole input sequence fits"),
            "async_scheduling": (
                True, "vllm/config/scheduler.py:145 (None), turned on at vllm/config/vllm.py:755-788 for executors "
                "that support it (uni: vllm/v1/executor/uniproc_executor.py:140, mp: "
                "vllm/v1/executor/multiproc_executor.py:491) without incompatible speculative decoding"),
        },
        "cache": {
            "block_size": (
                16, "vllm/config/cache.py:34 CacheConfig.DEFAULT_BLOCK_SIZE, kept unless the attention backend "
                "cannot take it (vllm/platforms/interface.py:427, vllm/v1/attention/backend.py:189)"),
            "enable_prefix_caching": (
                True, "vllm/engine/arg_utils.py:2143 from ModelConfig.is_prefix_caching_supported "
                "(vllm/config/model.py:1799: true for decoder attention)"),
            "gpu_memory_utilization": (0.9, "vllm/config/cache.py:41"),
            "prefix_caching_hash_algo": ("sha256", "vllm/config/cache.py:68"),
            "watermark": (0.0, "vLLM v1's KV cache manager keeps no free-block watermark"),
        },
    },
}
DEFAULTS_VERSION = "0.19.0"
MAX_MODEL_LEN_DEFAULT = "vllm/config/model.py:2045 _get_and_verify_max_len: unset is the model's max_position_embeddings"
BATCH_DEFAULTS = "depends on the GPU's memory and the entry point (vllm/engine/arg_utils.py:2024 get_batch_defaults)"
NOT_INFERRED = {
    "max_num_seqs": BATCH_DEFAULTS,
    "max_num_batched_tokens": BATCH_DEFAULTS,
    "max_model_len": "the model's max_position_embeddings (vllm/config/model.py:2045): give --model-config, else the "
                     "replay's model decides",
    "num_gpu_blocks": "sized by vLLM from the GPU's free memory, which the run did not record",
}
# engine_kwargs key -> (config section, engine.core field)
KWARGS = {
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "max_model_len": ("scheduler", "max_model_len"),
    "enable_chunked_prefill": ("scheduler", "enable_chunked_prefill"),
    "long_prefill_token_threshold": ("scheduler", "long_prefill_token_threshold"),
    "scheduling_policy": ("scheduler", "policy"),
    "async_scheduling": ("scheduler", "async_scheduling"),
    "scheduler_reserve_full_isl": ("scheduler", "scheduler_reserve_full_isl"),
    "block_size": ("cache", "block_size"),
    "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "gpu_memory_utilization": ("cache", "gpu_memory_utilization"),
    "num_gpu_blocks_override": ("cache", "num_gpu_blocks_override"),
    "prefix_caching_hash_algo": ("cache", "prefix_caching_hash_algo"),
    "tensor_parallel_size": ("parallel", "tensor_parallel_size"),
    "pipeline_parallel_size": ("parallel", "pipeline_parallel_size"),
    "data_parallel_size": ("parallel", "data_parallel_size"),
    "enable_expert_parallel": ("parallel", "enable_expert_parallel"),
    "distributed_executor_backend": ("parallel", "distributed_executor_backend"),
    "dtype": ("model", "dtype"),
    "kv_cache_dtype": ("model", "kv_cache_dtype"),
    "quantization": ("model", "quantization"),
    "enforce_eager": ("model", "enforce_eager"),
    "load_format": ("model", "load_format"),
    "kv_cache_memory_bytes": ("cache", "kv_cache_memory_bytes"),
    "disable_custom_all_reduce": ("parallel", "disable_custom_all_reduce"),
    "seed": ("model", "seed"),
}
# What vLLM resolved at boot, where a run records it (LLMServingSim's runner: `resolved_config`, one object
# per VllmConfig sub-config, and `kv_cache`, the cache vLLM allocated): (section, key) -> engine.core's
# (section, field). Preferred over engine_kwargs and defaults: these are the values the engine ran with.
RESOLVED = {
    ("scheduler_config", "max_num_seqs"): ("scheduler", "max_num_seqs"),
    ("scheduler_config", "max_num_batched_tokens"): ("scheduler", "max_num_batched_tokens"),
    ("scheduler_config", "max_model_len"): ("scheduler", "max_model_len"),
    ("scheduler_config", "enable_chunked_prefill"): ("scheduler", "enable_chunked_prefill"),
    ("scheduler_config", "long_prefill_token_threshold"): ("scheduler", "long_prefill_token_threshold"),
    ("scheduler_config", "policy"): ("scheduler", "policy"),
    ("scheduler_config", "async_scheduling"): ("scheduler", "async_scheduling"),
    ("scheduler_config", "scheduler_reserve_full_isl"): ("scheduler", "scheduler_reserve_full_isl"),
    ("model_config", "max_model_len"): ("scheduler", "max_model_len"),
    ("model_config", "dtype"): ("model", "dtype"),
    ("model_config", "quantization"): ("model", "quantization"),
    ("model_config", "enforce_eager"): ("model", "enforce_eager"),
    ("cache_config", "block_size"): ("cache", "block_size"),
    ("cache_config", "enable_prefix_caching"): ("cache", "enable_prefix_caching"),
    ("cache_config", "gpu_memory_utilization"): ("cache", "gpu_memory_utilization"),
    ("cache_config", "prefix_caching_hash_algo"): ("cache", "prefix_caching_hash_algo"),
    ("cache_config", "cache_dtype"): ("model", "kv_cache_dtype"),
    ("cache_config", "num_gpu_blocks"): ("cache", "num_gpu_blocks"),
    ("parallel_config", "tensor_parallel_size"): ("parallel", "tensor_parallel_size"),
    ("parallel_config", "pipeline_parallel_size"): ("parallel", "pipeline_parallel_size"),
    ("parallel_config", "data_parallel_size"): ("parallel", "data_parallel_size"),
    ("parallel_config", "enable_expert_parallel"): ("parallel", "enable_expert_parallel"),
    ("kv_cache", "num_gpu_blocks"): ("cache", "num_gpu_blocks"),
    ("kv_cache", "block_size"): ("cache", "block_size"),
    ("kv_cache", "gpu_memory_utilization"): ("cache", "gpu_memory_utilization"),
    ("kv_cache", "enable_prefix_caching"): ("cache", "enable_prefix_caching"),
    ("kv_cache", "kv_cache_memory_bytes"): ("cache", "kv_cache_memory_bytes"),
}
# The front end's resolved num_gpu_blocks is the sum over its data-parallel engines
# (vllm/v1/engine/core_client.py, "Sum num_gpu_blocks from all engines in DP case"); each engine's is 1/N.
DP_BLOCKS_SUMMED = "vllm/v1/engine/core_client.py sums num_gpu_blocks over the data-parallel engines"


def run_config(meta_path: Path, meta: dict[str, Any], hf_config: dict[str, Any] | None) -> tuple[dict, dict]:
    """(config, import entry): engine_kwargs under engine.core's names, then the version's defaults."""
    kwargs = meta.get("engine_kwargs")
    if not isinstance(kwargs, dict):
        raise WorkloadError(meta_path, "engine_kwargs", "absent or not an object")
    version = meta.get("vllm_version")
    if not isinstance(version, str) or not version:
        raise WorkloadError(meta_path, "vllm_version", "absent or not a string")
    model_name = meta.get("model") or kwargs.get("model")
    if not isinstance(model_name, str) or not model_name:
        raise WorkloadError(meta_path, "model", "absent or not a string")
    config: dict[str, dict[str, Any]] = {"model": {"model": model_name, "source": "vllm run"}, "scheduler": {},
                                         "cache": {}, "parallel": {}}
    recorded, inferred, unknown = [], {}, {}
    for key, (section, name) in KWARGS.items():
        if kwargs.get(key) is not None:
            config[section][name] = kwargs[key]
            recorded.append(f"{section}.{name}")
    if config["cache"].get("num_gpu_blocks_override") is not None:
        config["cache"]["num_gpu_blocks"] = config["cache"]["num_gpu_blocks_override"]
        recorded.append("cache.num_gpu_blocks")
    resolved_from = _resolved(meta_path, meta, config, recorded)
    table_version = version if version in VLLM_DEFAULTS else DEFAULTS_VERSION
    source = f"vLLM {table_version} default" + ("" if table_version == version else f" (assumed for {version})")
    for section, defaults in VLLM_DEFAULTS[table_version].items():
        for name, (value, where) in defaults.items():
            if name in config[section]:
                continue
            if name == "async_scheduling" and (kwargs.get("speculative_config") or
                                               kwargs.get("distributed_executor_backend") == "ray"):
                unknown[f"scheduler.{name}"] = "the run used speculative decoding or Ray, which may turn it off"
                continue
            config[section][name] = value
            inferred[f"{section}.{name}"] = f"{source}: {where}"
    if hf_config is not None:
        config["model"]["hf_config"] = hf_config
        archs = hf_config.get("architectures") or []
        config["model"]["architecture"] = archs[0] if archs else None
        positions = hf_config.get("max_position_embeddings")
        if "max_model_len" not in config["scheduler"] and isinstance(positions, int) and positions > 0:
            config["scheduler"]["max_model_len"] = positions
            inferred["scheduler.max_model_len"] = f"{source}: {MAX_MODEL_LEN_DEFAULT} (from --model-config)"
    for name, why in NOT_INFERRED.items():
        section = "cache" if name == "num_gpu_blocks" else "scheduler"
        if name not in config[section]:
            unknown[f"{section}.{name}"] = why
    if not config["parallel"]:
        del config["parallel"]
    check_run_config(meta_path, config)
    entry = {"recorded": recorded, "inferred": inferred, "unknown": unknown, "vllm_defaults_of": table_version,
             "resolved_from": resolved_from}
    return config, entry


def _resolved(meta_path: Path, meta: dict[str, Any], config: dict[str, dict[str, Any]], recorded: list[str]) -> dict[str, str]:
    """What vLLM resolved (meta's `resolved_config` and `kv_cache`) over engine_kwargs: each value taken
    says where from. A value a run could not serialize (a `<type>` tag) is left out."""
    taken: dict[str, str] = {}
    sections = {"resolved_config": meta.get("resolved_config") or {}, "kv_cache": meta.get("kv_cache") or {}}
    for where, value in sections.items():
        if not isinstance(value, dict):
            raise WorkloadError(meta_path, where, "not an object")
    for (part, key), (section, name) in RESOLVED.items():
        holder = sections["resolved_config"].get(part) if part.endswith("_config") else sections[part]
        if not isinstance(holder, dict) or holder.get(key) is None:
            continue
        value = holder[key]
        if isinstance(value, str) and value.startswith("<"):
            continue
        if name == "dtype" and isinstance(value, str):
            value = value.removeprefix("torch.")
        if name == "num_gpu_blocks" and f"{section}.{name}" in taken:
            continue  # resolved_config's and kv_cache's are the same number: keep the first read
        config[section][name] = value
        taken[f"{section}.{name}"] = f"{part}.{key}"
        if f"{section}.{name}" not in recorded:
            recorded.append(f"{section}.{name}")
    blocks, dp = config["cache"].get("num_gpu_blocks"), config["parallel"].get("data_parallel_size") or 1
    if "cache.num_gpu_blocks" in taken and isinstance(blocks, int) and isinstance(dp, int) and dp > 1:
        config["cache"]["num_gpu_blocks"] = blocks // dp
        taken["cache.num_gpu_blocks"] += f" / {dp} data-parallel engines ({DP_BLOCKS_SUMMED})"
    return taken


BOOL_FIELDS = ("enable_chunked_prefill", "async_scheduling", "scheduler_reserve_full_isl", "enable_prefix_caching",
               "enable_expert_parallel", "enforce_eager", "disable_custom_all_reduce")
# Integer engine arguments and the range a real run's can take (engine.core names); past it a number is
# corrupt, and a replay would size tables by it. Lengths stop at 2^30 tokens, past any model's context.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "max_num_seqs": (1, 1 << 20), "max_num_batched_tokens": (1, 1 << 30), "max_model_len": (1, 1 << 30),
    "long_prefill_token_threshold": (0, 1 << 30), "block_size": (1, 1 << 16),
    "num_gpu_blocks_override": (2, 1 << 40), "num_gpu_blocks": (2, 1 << 40), "kv_cache_memory_bytes": (1, 1 << 50),
    "tensor_parallel_size": (1, 1 << 16), "pipeline_parallel_size": (1, 1 << 16), "data_parallel_size": (1, 1 << 16),
    "seed": (0, (1 << 64) - 1),  # torch and numpy take 64-bit seeds
}


def check_run_config(meta_path: Path, config: dict[str, dict[str, Any]]) -> None:
    """The recorded engine arguments as engine.core's configs take them: a bad one fails here, naming the
    run's meta.json, rather than in a later replay."""
    from engine.core.config import CacheConfig, SchedulerConfig

    names = {name: key for key, (_, name) in KWARGS.items()}
    names["num_gpu_blocks"] = "num_gpu_blocks_override"
    for section in ("scheduler", "cache", "parallel", "model"):
        for name, value in config.get(section, {}).items():
            if name in BOOL_FIELDS and not isinstance(value, bool):
                raise WorkloadError(meta_path, f"engine_kwargs.{names.get(name, name)}", f"{value!r} is not a boolean")
    cache = {k: v for k, v in config["cache"].items() if k in CacheConfig.__dataclass_fields__}
    try:
        SchedulerConfig(**config["scheduler"])
        CacheConfig(**cache)
    except (ValueError, TypeError) as e:
        field, _, what = str(e).partition(": ")
        raise WorkloadError(meta_path, f"engine_kwargs.{names.get(field, field)}", what or str(e)) from None
    for section in ("scheduler", "cache", "parallel", "model"):
        for name, value in config.get(section, {}).items():
            if name in INT_BOUNDS and value is not None:
                lo, hi = INT_BOUNDS[name]
                if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                    raise WorkloadError(meta_path, f"engine_kwargs.{names.get(name, name)}",
                                        f"{value!r} is not an integer in [{lo}, {hi}]")
