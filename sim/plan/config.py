"""One deployment configuration of a `sim plan` sweep: replicas, router, model, hardware, and the
scheduler/cache options (engine.core's SchedulerConfig/CacheConfig fields; None: the engine default).

Its `to_dict()` is the JSON a results file stores and keys finished configurations by, unchanged from
when configurations were plain dicts, so older results files still resume.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from sim.cost_models import DEFAULT_HARDWARE, DEFAULT_MODEL
from sim.cost_models.deployment import Deployment
from sim.flags import sim_flags

DEFAULT_ROUTER = "least_outstanding"
DEFAULT_MAX_MODEL_LEN = 32768
_DEFAULT_BLOCK_SIZE = CacheConfig().block_size


# Fields added after results files first shipped, with their defaults (left out of `to_dict` when default).
LATER_FIELDS: dict[str, Any] = {"tensor_parallel_size": 1, "async_scheduling": None, "data_parallel_size": 1,
                                "enable_expert_parallel": False, "kv_cache_dtype": "auto", "quantization": None}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """Plain data (it travels to worker processes and Ray tasks); `num_gpu_blocks` None: the roofline
    model's KV memory at `gpu_memory_utilization`."""

    replicas: int = 1
    router: str = DEFAULT_ROUTER
    hardware: str = DEFAULT_HARDWARE
    model: str = DEFAULT_MODEL
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = _DEFAULT_BLOCK_SIZE
    long_prefill_token_threshold: int | None = None
    policy: str | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None
    tensor_parallel_size: int = 1
    async_scheduling: bool | None = None
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    kv_cache_dtype: str = "auto"
    quantization: str | None = None

    @property
    def num_gpus(self) -> int:
        """Each replica runs data parallel x tensor parallel GPUs."""
        return self.replicas * self.data_parallel_size * self.tensor_parallel_size

    def deployment(self) -> Deployment:
        return Deployment(tensor_parallel_size=self.tensor_parallel_size, data_parallel_size=self.data_parallel_size,
                          enable_expert_parallel=self.enable_expert_parallel, kv_cache_dtype=self.kv_cache_dtype,
                          quantization=None if self.quantization in (None, "none") else self.quantization)

    def _set(self, owner: type) -> dict[str, Any]:
        names = {fl.field for fl in sim_flags("plan") if fl.owner == owner.__name__}
        return {k: v for k, v in self.to_dict().items() if k in names and v is not None}

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(**self._set(SchedulerConfig))

    def cache_config(self, num_gpu_blocks: int | None = None) -> CacheConfig:
        """`num_gpu_blocks` when the configuration leaves it to the cost model."""
        return CacheConfig(**self._set(CacheConfig), num_gpu_blocks=self.num_gpu_blocks or num_gpu_blocks)

    def to_dict(self) -> dict[str, Any]:
        """Every field; those added after results files first shipped only where they differ from their
        default, so files written before they existed still key their configurations the same."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, default in LATER_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    @property
    def key(self) -> str:
        """What a results file keys this configuration by."""
        return self.key_without(())

    def key_without(self, fields: Iterable[str]) -> str:
        """`key` with `fields` unset: what configurations differing in those alone share."""
        return json.dumps({**self.to_dict(), **dict.fromkeys(fields)}, sort_keys=True)

    def label(self, swept: list[str]) -> str:
        return " ".join(f"{k}={getattr(self, k)}" for k in swept) or "default"


def field_type(name: str) -> type:
    """int, float, bool or str: how `--sweep` parses values of `name`."""
    f = next(f for f in dataclasses.fields(PlanConfig) if f.name == name)
    return {"int": int, "int | None": int, "float | None": float, "bool | None": bool, "bool": bool}.get(str(f.type), str)


SWEEP_KEYS = tuple(f.name for f in dataclasses.fields(PlanConfig))


