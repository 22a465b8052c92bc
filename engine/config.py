"""One config object handed down the whole chain (vLLM's VllmConfig), built from engine args.

`EngineArgs` carries vLLM's flag names; `create_engine_config` resolves the model (built-in, local
checkpoint or named preset), the device and dtype, and validates every field with its name.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.flags import check_choice, flags_of, option, same_option
from engine.core.model_shapes import BUILTIN, check_model_config, get_model_config, read_config_json, weight_count
DEFAULT_CPU_KV_CACHE_MEMORY = 512 << 20


@dataclass(slots=True, kw_only=True)
class ModelConfig:
    """What to run: `source` is builtin, checkpoint or preset; `hf_config` is a transformers config."""

    model: str
    source: str
    hf_config: Any
    model_dir: Path | None
    tokenizer_dir: Path | None
    load_format: str
    dtype: str
    seed: int
    max_model_len: int
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    kv_cache_dtype: str = "auto"

    @property
    def kv_dtype(self) -> str:
        """The torch dtype name the KV cache is stored in: fp8 is vLLM's e4m3 with scale 1.0."""
        return "float8_e4m3fn" if self.kv_cache_dtype == "fp8" else self.dtype

    @property
    def architecture(self) -> str:
        return (getattr(self.hf_config, "architectures", None) or ["?"])[0]

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.hf_config, "eos_token_id", None)
        return eos[0] if isinstance(eos, list) else eos

    def to_dict(self) -> dict:
        return {"model": self.model, "source": self.source, "architecture": self.architecture,
                "model_dir": str(self.model_dir) if self.model_dir else None, "load_format": self.load_format,
                "dtype": self.dtype, "kv_cache_dtype": self.kv_cache_dtype, "seed": self.seed,
                "max_model_len": self.max_model_len,
                "tokenizer": str(self.tokenizer_dir) if self.tokenizer_dir else None,
                "hf_config": self.hf_config.to_dict()}


@dataclass(slots=True)
class DeviceConfig:
    device: str
    num_threads: int | None = None
    attention_backend: str = "auto"
    enforce_eager: bool = False


@dataclass(slots=True)
class ObservabilityConfig:
    """Where a run's trace directory and spans go (vLLM's --otlp-traces-endpoint included)."""

    trace_dir: str | None = None
    otlp_traces_endpoint: str | None = None
    overwrite_trace: bool = False

    @property
    def enabled(self) -> bool:
        return self.trace_dir is not None or self.otlp_traces_endpoint is not None


@dataclass(slots=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def to_dict(self) -> dict:
        return {"model": self.model_config.to_dict(), "cache": self.cache_config.to_dict(),
                "scheduler": self.scheduler_config.to_dict(),
                "device": dataclasses.asdict(self.device_config),
                "observability": dataclasses.asdict(self.observability_config)}


LOAD_FORMATS = ("auto", "safetensors", "dummy")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash-attn")
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass
class EngineArgs:
    """Engine flags under vLLM's names; `LLM(**kwargs)` and the CLI both land here. Scheduler and cache
    options are declared on SchedulerConfig/CacheConfig (shared with the simulator) and repeated here by
    `same_option`, which copies their flag, help, choices and default."""

    model: str | None = option(None, "local HF checkpoint dir or preset; default: built-in model")
    tokenizer: str | None = option(None, "tokenizer dir (default: the model's)")
    trust_remote_code: bool = option(False, "run a checkpoint's own Python code (its config's auto_map); without "
                                     "it such a checkpoint is refused, and nothing is ever asked on stdin")
    skip_tokenizer_init: bool = option(False, "load no tokenizer: prompts must be token ids, outputs carry no text")
    load_format: str = option("auto", "how to load the weights", choices=LOAD_FORMATS)
    dtype: str = option("auto", "weight and activation dtype (auto: float32 on cpu, else bfloat16)", choices=DTYPES)
    device: str = option("auto", "auto | cpu | cuda[:N]")
    seed: int = option(0, "seed for dummy weights and unseeded sampling")
    max_model_len: int | None = same_option(SchedulerConfig, "max_model_len", default=None)
    hf_overrides: dict | str | None = option(
        None, "JSON object of model config fields to override, e.g. '{\"max_position_embeddings\": 8192}'")
    max_num_seqs: int = same_option(SchedulerConfig, "max_num_seqs")
    max_num_batched_tokens: int | None = same_option(SchedulerConfig, "max_num_batched_tokens")
    block_size: int = same_option(CacheConfig, "block_size")
    gpu_memory_utilization: float = same_option(CacheConfig, "gpu_memory_utilization")
    num_gpu_blocks_override: int | None = same_option(CacheConfig, "num_gpu_blocks_override")
    kv_cache_memory: int | None = same_option(CacheConfig, "kv_cache_memory")
    enable_prefix_caching: bool = same_option(CacheConfig, "enable_prefix_caching")
    enable_chunked_prefill: bool = same_option(SchedulerConfig, "enable_chunked_prefill")
    long_prefill_token_threshold: int = same_option(SchedulerConfig, "long_prefill_token_threshold")
    scheduling_policy: str = same_option(SchedulerConfig, "policy")
    async_scheduling: bool | None = same_option(SchedulerConfig, "async_scheduling", default=None)
    scheduler_reserve_full_isl: bool = same_option(SchedulerConfig, "scheduler_reserve_full_isl")
    attention_backend: str = option("auto", "attention kernels", choices=ATTENTION_BACKENDS)
    enforce_eager: bool = option(False, "no CUDA graphs")
    tensor_parallel_size: int = option(1, "GPUs one model is sharded over (the engine runs on one; `sim replay` "
                                       "prices more)")
    kv_cache_dtype: str = option("auto", "KV cache dtype (auto: the model's; fp8: float8 e4m3 storage, half of "
                                 "bf16's bytes, values saturated at +-448 and widened on read; not with flash-attn)",
                                 choices=KV_CACHE_DTYPES)
    num_threads: int | None = option(None, "torch CPU threads (default: all cores but one)")
    trace: str | None = option(None, "write a trace directory here")
    overwrite: bool = option(False, "replace a trace already in --trace (without it such a directory is refused)")
    otlp_traces_endpoint: str | None = option(None, "also send spans to this OTLP/HTTP URL")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def _config_kwargs(self, owner: type) -> dict[str, Any]:
        """The options declared on `owner` (SchedulerConfig, CacheConfig) under its field names."""
        return {fl.field: getattr(self, fl.dest) for fl in flags_of(EngineArgs) if fl.owner == owner.__name__}

    def create_engine_config(self) -> EngineConfig:
        for fl in flags_of(EngineArgs):
            check_choice(getattr(self, fl.dest), fl)
        if self.tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size: the engine runs on one device, got {self.tensor_parallel_size} "
                             "(sim replay --tensor-parallel-size prices sharded runs)")
        if self.kv_cache_dtype == "fp8" and self.attention_backend == "flash-attn":
            raise ValueError("kv_cache_dtype: fp8 runs on the torch or triton attention backend; flash-attn reads "
                             "only a float16/bfloat16 cache")
        device = resolve_device(self.device)
        model_config = self._model_config(device)
        sched_kw = self._config_kwargs(SchedulerConfig)
        if sched_kw["async_scheduling"] is None:
            sched_kw["async_scheduling"] = device.startswith("cuda")  # vLLM's default: on where the platform allows it
        scheduler_config = SchedulerConfig(**{**sched_kw, "max_model_len": model_config.max_model_len})
        cache_config = CacheConfig(**self._config_kwargs(CacheConfig))
        check_weights_fit(model_config, device)
        check_kv_cache_fits(model_config, cache_config, device)
        most = 4 * (os.cpu_count() or 1)  # a few times the cores may be an experiment; more only starts threads
        if self.num_threads is not None and not 1 <= self.num_threads <= most:
            raise ValueError(f"num_threads: must be in [1, {most}] (4x this machine's cores), got {self.num_threads}")
        return EngineConfig(model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config,
                            device_config=DeviceConfig(device=device, num_threads=self.num_threads,
                                                       attention_backend=self.attention_backend,
                                                       enforce_eager=self.enforce_eager),
                            observability_config=ObservabilityConfig(trace_dir=self.trace,
                                                                     otlp_traces_endpoint=self.otlp_traces_endpoint,
                                                                     overwrite_trace=self.overwrite))

    def _model_config(self, device: str) -> ModelConfig:
        from engine.builtin import BUILTIN_DIR
        from engine.model_executor.presets import PRESETS, get_preset, hf_config_from_dict

        name = self.model or BUILTIN
        if name == BUILTIN:
            source, model_dir, tok_dir, load_format = "builtin", None, BUILTIN_DIR, "dummy"
            hf_config = hf_config_from_dict(get_model_config(BUILTIN))
        elif name in PRESETS:
            source, model_dir, tok_dir, load_format = "preset", None, None, "dummy"
            preset = get_preset(name)
            hf_config = hf_config_from_dict(preset)
        else:
            path = Path(name)
            if not (path / "config.json").is_file():
                raise ValueError(f"model: {name!r} is neither a directory with config.json nor a preset "
                                 f"({', '.join(sorted(PRESETS))})")
            source, model_dir, tok_dir, load_format = "checkpoint", path, path, "safetensors"
            hf_config = _load_hf_config(path, self.trust_remote_code)
        if self.load_format != "auto":
            if self.load_format == "safetensors" and model_dir is None:
                raise ValueError(f"load_format: 'safetensors' needs a checkpoint directory, {name!r} has none")
            load_format = self.load_format
        if self.tokenizer:
            tok_dir = Path(self.tokenizer)
        if self.skip_tokenizer_init:
            tok_dir = None
        dtype = resolve_dtype(self.dtype, device)
        overrides = parse_hf_overrides(self.hf_overrides)
        check_model_config({**hf_config.to_dict(), **overrides}, name, moe=True)  # before transformers' own typed setters
        if overrides:
            hf_config.update(overrides)
        limit = getattr(hf_config, "max_position_embeddings", None) or 4096
        max_model_len = self.max_model_len or limit
        if max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1, got {max_model_len}")
        if max_model_len > limit:
            # Positions past the model's table have no rotary embedding: refuse now, not at the first long step.
            raise ValueError(f"max_model_len: {max_model_len} is more than the model's max_position_embeddings="
                             f"{limit}; lower --max-model-len or override it with --hf-overrides "
                             f"'{{\"max_position_embeddings\": {max_model_len}}}'")
        return ModelConfig(model=name, source=source, hf_config=hf_config, model_dir=model_dir,
                           tokenizer_dir=tok_dir, load_format=load_format, dtype=dtype, seed=self.seed,
                           max_model_len=max_model_len, skip_tokenizer_init=self.skip_tokenizer_init,
                           trust_remote_code=self.trust_remote_code, kv_cache_dtype=self.kv_cache_dtype)


def device_memory_bytes(device: str) -> tuple[int, str]:
    """(bytes, whose) of the memory a KV cache on `device` can take at most: the GPU's total, or the
    machine's physical memory, less where a cgroup limit is lower."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[1], f"memory {device} has"
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = ""
    if limit.isdigit() and int(limit) < total:
        return int(limit), "memory this process's cgroup may use"
    return total, "memory this machine has"


def check_weights_fit(model_config: ModelConfig, device: str) -> None:
    """The model's weights (a preset's dummy ones are allocated in full) must fit in the device's memory:
    refused here in one line, not by a MemoryError when the first layer is built."""
    import torch

    config = model_config.hf_config.to_dict()
    config = config.get("text_config") or config
    nbytes = weight_count(config) * torch.empty((), dtype=getattr(torch, model_config.dtype)).element_size()
    total, whose = device_memory_bytes(device)
    if nbytes > total:
        raise ValueError(f"model: {model_config.model}'s {nbytes / 1e9:.1f} GB of {model_config.dtype} weights are more "
                         f"than the {total / 2**30:.1f} GiB of {whose}; `sim replay --model` prices it without "
                         "weights")


def check_kv_cache_fits(model_config: ModelConfig, cache: CacheConfig, device: str) -> None:
    """A KV cache asked for by size (--kv-cache-memory, the CPU default) or by count (--num-gpu-blocks-override)
    must fit in the device's memory: refused here in one line, not by a MemoryError or the kernel's OOM
    killer when the pool is allocated. A CUDA cache sized from free memory needs no check."""
    import torch

    from engine.model_executor.loader import kv_bytes_per_block, kv_cache_spec

    per_block = kv_bytes_per_block(kv_cache_spec(model_config.hf_config), cache.block_size,
                                   getattr(torch, model_config.kv_dtype))
    if cache.num_gpu_blocks_override is not None:
        field, asked = "num_gpu_blocks_override", cache.num_gpu_blocks_override * per_block
        what = f"{cache.num_gpu_blocks_override:,} blocks of {per_block:,} bytes ({asked:.3g} bytes)"
    elif cache.kv_cache_memory is not None or not device.startswith("cuda"):
        field, asked = "kv_cache_memory", cache.kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY
        what = f"{asked:,} bytes"
    else:
        return
    total, whose = device_memory_bytes(device)
    if asked > total:
        raise ValueError(f"{field}: a KV cache of {what} is more than the {total / 2**30:.1f} GiB of {whose}; "
                         "ask for less")


def _load_hf_config(path: Path, trust_remote_code: bool) -> Any:
    """transformers' config of a checkpoint, its fields checked first (transformers' typed configs raise
    errors of their own, not ValueErrors); every problem is one ValueError naming the file."""
    from transformers import AutoConfig

    check_model_config(read_config_json(path / "config.json"), str(path / "config.json"), moe=True)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ValueError(f"model: {path}/config.json asks to run the checkpoint's own code (auto_map); "
                             "pass --trust-remote-code to allow it") from None
        raise ValueError(f"model: {path}/config.json: {' '.join(str(e).split())}") from None
    except (OSError, TypeError) as e:
        raise ValueError(f"model: {path}/config.json: {' '.join(str(e).split())}") from None


def parse_hf_overrides(value: dict | str | None) -> dict:
    """vLLM's hf_overrides: a dict from Python, a JSON object from the command line."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"hf_overrides: not valid JSON ({e.msg} at character {e.pos}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"hf_overrides: must be a JSON object of config fields, got {type(value).__name__}")
    return value


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device: must be auto, cpu or cuda, got {device!r}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but torch sees no CUDA device")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return dtype


def default_num_threads() -> int:
    """All usable cores but one: OpenMP workers that spin against another busy thread (the span
    exporter, the tokenizer, a neighbour process) slow a step several times over, and a free core
    keeps the worst case close to the best."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


# Spin iterations of torch's OpenMP runtime (libgomp) before a waiting worker sleeps. Its default spins
# for milliseconds, so a worker waiting on a partner that shares a core with another busy process burns
# its own core and keeps the partner from moving to it; a short spin lets the waiter sleep instead.
OPENMP_SPIN_COUNT = "1000"


def bound_openmp_spin() -> bool:
    """Bound OpenMP spin-waiting (GOMP_SPINCOUNT) unless the user chose a wait policy; True when it is
    bounded. Call it before torch loads, where an engine is built (LLM, `engine run`): libgomp reads the
    variable once, as torch loads it, so afterwards this only reports False."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return True
    if "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True
