"""meta.json of a vLLM trace: vLLM's version and its scheduler and cache config under the keys that
engine.core's SchedulerConfig/CacheConfig use, so `sim replay` rebuilds the same scheduler from it."""
from __future__ import annotations

import platform
from typing import Any

from transformers import PretrainedConfig


def _model_meta(model_config: Any) -> dict[str, Any]:
    hf = getattr(model_config, "hf_config", None)
    archs = getattr(hf, "architectures", None) or []
    return {"model": str(model_config.model), "source": "checkpoint", "architecture": archs[0] if archs else None,
            "dtype": str(model_config.dtype).removeprefix("torch."),
            "hf_config": hf.to_dict() if isinstance(hf, PretrainedConfig) else None}


def scheduler_meta(scheduler: Any) -> dict[str, Any]:
    """The knobs that decide steps, as the running scheduler holds them (after vLLM's own defaulting)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    sc = scheduler.scheduler_config
    return {"max_model_len": scheduler.max_model_len, "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_scheduled_tokens,
            "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
            "long_prefill_token_threshold": int(sc.long_prefill_token_threshold), "policy": str(sc.policy),
            # The class decides: vLLM's CPU platform turns the config flag off, yet an AsyncScheduler
            # (driven in batch-queue order) still schedules ahead.
            "async_scheduling": isinstance(scheduler, AsyncScheduler),
            "scheduler_reserve_full_isl": bool(getattr(sc, "scheduler_reserve_full_isl", False)),
            "scheduler_cls": f"{type(scheduler).__module__}.{type(scheduler).__qualname__}"}


def cache_meta(scheduler: Any) -> dict[str, Any]:
    cc = scheduler.cache_config
    pool = scheduler.kv_cache_manager.block_pool
    return {"block_size": scheduler.block_size, "num_gpu_blocks": pool.num_gpu_blocks,
            "enable_prefix_caching": bool(scheduler.kv_cache_manager.enable_caching), "watermark": 0.0,
            "gpu_memory_utilization": cc.gpu_memory_utilization,
            "num_gpu_blocks_override": cc.num_gpu_blocks_override,
            "prefix_caching_hash_algo": str(getattr(cc, "prefix_caching_hash_algo", ""))}


def trace_meta(scheduler: Any) -> dict[str, Any]:
    """Everything meta.json says about a vLLM run, read from the scheduler vLLM built."""
    import vllm

    vc = scheduler.vllm_config
    cache = cache_meta(scheduler)
    return {"source": "vllm", "backend": "vllm",
            "config": {"model": _model_meta(vc.model_config), "scheduler": scheduler_meta(scheduler),
                       "cache": cache},
            "kv_cache": {"num_blocks": cache["num_gpu_blocks"], "block_size": cache["block_size"],
                         "how": "vLLM's KV cache sizing"},
            "device": {"type": str(vc.device_config.device_type), "name": platform.processor() or platform.machine()},
            "vllm": {"version": vllm.__version__}}
