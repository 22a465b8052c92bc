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
from engine.core.model_shapes import BUILTIN, get_model_config
DEFAULT_CPU_KV_CACHE_MEMORY = 512 << 20


@dataclass(slots=True)
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
                "dtype": self.dtype, "seed": self.seed, "max_model_len": self.max_model_len,
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


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class EngineArgs:
    """Engine flags under vLLM's names; `LLM(**kwargs)` and the CLI both land here."""

    model: str | None = field(default=None, metadata=_help("local HF checkpoint dir or preset; default: built-in model"))
    tokenizer: str | None = field(default=None, metadata=_help("tokenizer dir (default: the model's)"))
    skip_tokenizer_init: bool = field(default=False, metadata=_help(
        "load no tokenizer: prompts must be token ids, outputs carry no text"))
    load_format: str = field(default="auto", metadata=_help("auto | safetensors | dummy"))
    dtype: str = field(default="auto", metadata=_help("auto | float32 | bfloat16 | float16"))
    device: str = field(default="auto", metadata=_help("auto | cpu | cuda"))
    seed: int = field(default=0, metadata=_help("seed for dummy weights and unseeded sampling"))
    max_model_len: int | None = field(default=None, metadata=_help("context length (default: the model's)"))
    hf_overrides: dict | str | None = field(default=None, metadata=_help(
        "JSON object of model config fields to override, e.g. '{\"max_position_embeddings\": 8192}'"))
    max_num_seqs: int = field(default=256, metadata=_help("max requests in one step"))
    max_num_batched_tokens: int | None = field(default=None, metadata=_help("token budget per step"))
    block_size: int = field(default=16, metadata=_help("tokens per KV block"))
    gpu_memory_utilization: float = field(default=0.9, metadata=_help("share of GPU memory for the engine"))
    num_gpu_blocks_override: int | None = field(default=None, metadata=_help("force the KV block count"))
    kv_cache_memory: int | None = field(default=None, metadata=_help("KV cache bytes (CPU default 512 MiB)"))
    enable_prefix_caching: bool = field(default=True, metadata=_help("reuse KV of shared prefixes"))
    enable_chunked_prefill: bool = field(default=True, metadata=_help("split long prompts over steps"))
    long_prefill_token_threshold: int = field(default=0, metadata=_help("cap tokens per prefill chunk (0: off)"))
    scheduling_policy: str = field(default="fcfs", metadata=_help("fcfs | priority"))
    attention_backend: str = field(default="auto", metadata=_help("auto | torch | triton | flash-attn"))
    enforce_eager: bool = field(default=False, metadata=_help("no CUDA graphs"))
    num_threads: int | None = field(default=None, metadata=_help("torch CPU threads (default: all cores but one)"))
    trace: str | None = field(default=None, metadata=_help("write a trace directory here"))
    otlp_traces_endpoint: str | None = field(default=None, metadata=_help("also send spans to this OTLP/HTTP URL"))

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            kw: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata.get("help")}
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            else:
                kind = {"int | None": int, "int": int, "float": float}.get(str(f.type), str)
                parser.add_argument(flag, type=kind, **kw)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def create_engine_config(self) -> EngineConfig:
        device = resolve_device(self.device)
        model_config = self._model_config(device)
        scheduler_config = SchedulerConfig(
            max_model_len=model_config.max_model_len, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold, policy=self.scheduling_policy)
        cache_config = CacheConfig(
            block_size=self.block_size, enable_prefix_caching=self.enable_prefix_caching,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override, kv_cache_memory=self.kv_cache_memory)
        if self.attention_backend not in ("auto", "torch", "triton", "flash-attn"):
            raise ValueError(f"attention_backend: must be auto, torch, triton or flash-attn, got {self.attention_backend!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: must be >= 1, got {self.num_threads}")
        return EngineConfig(model_config, cache_config, scheduler_config,
                            DeviceConfig(device, self.num_threads, self.attention_backend, self.enforce_eager),
                            ObservabilityConfig(self.trace, self.otlp_traces_endpoint))

    def _model_config(self, device: str) -> ModelConfig:
        from transformers import AutoConfig

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
            hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
        if self.load_format != "auto":
            if self.load_format not in ("safetensors", "dummy"):
                raise ValueError(f"load_format: must be auto, safetensors or dummy, got {self.load_format!r}")
            if self.load_format == "safetensors" and model_dir is None:
                raise ValueError(f"load_format: 'safetensors' needs a checkpoint directory, {name!r} has none")
            load_format = self.load_format
        if self.tokenizer:
            tok_dir = Path(self.tokenizer)
        if self.skip_tokenizer_init:
            tok_dir = None
        dtype = resolve_dtype(self.dtype, device)
        overrides = parse_hf_overrides(self.hf_overrides)
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
        return ModelConfig(name, source, hf_config, model_dir, tok_dir, load_format, dtype, self.seed, max_model_len,
                           self.skip_tokenizer_init)


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
    valid = ("auto", "float32", "bfloat16", "float16")
    if dtype not in valid:
        raise ValueError(f"dtype: must be one of {', '.join(valid)}, got {dtype!r}")
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return dtype


def default_num_threads() -> int:
    """All usable cores but one. OpenMP workers that spin against another busy thread (the span
    exporter, the tokenizer, a neighbour process) slow a step by up to 5x here: on this 2-core machine a
    64-sequence decode step of the built-in model took 35-42 ms on 1 thread, and 29 ms idle but
    155-185 ms under load on 2 threads. Leaving one core free keeps the worst case close to the best."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


# Spin iterations of torch's OpenMP runtime (libgomp) before a waiting worker sleeps; its default, ~300k,
# spins for milliseconds, so a thread waiting on a partner that shares a core with another busy process
# burns its own core and keeps the partner from migrating to it: with a busy neighbour, 2 threads ran a
# decode-sized matmul loop 7x slower than 1 (1,150 against 160 ms); with 1,000 spins they matched it.
OPENMP_SPIN_COUNT = "1000"


def bound_openmp_spin() -> bool:
    """Bound OpenMP spin-waiting unless the user chose a wait policy. False when it is too late: libgomp
    reads the variable once, when torch loads it."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return True
    if "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True


OPENMP_SPIN_BOUNDED = bound_openmp_spin()
