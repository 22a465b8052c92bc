"""One line that says what a trace is a run of: which engine or simulator, which model on what, and for a
simulation which cost model. The TUI's header and `sim replay` use the same words for the same run."""
from __future__ import annotations

from typing import Any


def _model(meta: dict[str, Any]) -> str | None:
    model = (meta.get("config") or {}).get("model") or {}
    name = model.get("model") or model.get("name")
    if name in (None, "hf_config"):
        name = ((meta.get("cost_model") or {}).get("model") or {}).get("name") or name
    arch = model.get("architecture")
    return f"{name} ({arch})" if name and arch and str(arch).lower() not in str(name).lower() else name


def _device(meta: dict[str, Any]) -> str | None:
    device = meta.get("device") or {}
    if not isinstance(device, dict):
        return str(device)
    if device.get("type") == "sim":
        return device.get("hardware") or (meta.get("cost_model") or {}).get("hardware", {}).get("name")
    return device.get("name") or device.get("type")


def describe_cost_model(cost: dict[str, Any]) -> str:
    """`roofline`, `recorded step times`, `calibrated (fitted on runs/a, runs/b)`, as the meta records it."""
    name = cost.get("name", "?")
    if name == "recorded":
        return "recorded step times"
    fitted = cost.get("fitted_on") or cost.get("traces")
    if fitted:
        fitted = ", ".join(map(str, fitted)) if isinstance(fitted, list) else str(fitted)
        return f"{name} (fitted on {fitted})"
    found = cost.get("kernels")
    kernels: dict[str, Any] = found if isinstance(found, dict) else {}
    if kernels.get("bundle"):
        name = (f"kernels measured on {kernels.get('gpu')} ({kernels.get('model')}, vLLM {kernels.get('vllm_version')}, "
                f"profiled {str(kernels.get('profiled_at'))[:10]}; {kernels['bundle']})")
    tp = cost.get("tensor_parallel_size") or 1
    return f"{name}, tensor parallel {tp}" if tp > 1 else name


def describe_run(meta: dict[str, Any]) -> str:
    """E.g. `engine · builtin (qwen3) on cpu`, `sim · llama-3.1-8b on h200 · roofline`,
    `vllm 0.32.0 · tiny on cpu`."""
    source = str(meta.get("source", "?"))
    vllm = (meta.get("vllm") or {}).get("version") or (meta.get("versions") or {}).get("vllm")
    if source != "sim" and vllm:
        source = f"vllm {vllm}"
    model, device = _model(meta), _device(meta)
    what = " on ".join(str(x) for x in (model, device) if x)
    parts = [source] + ([what] if what else [])
    if meta.get("cost_model"):
        parts.append(describe_cost_model(meta["cost_model"]))
    return " · ".join(parts)


def scheduling_mode(scheduler: dict[str, Any], cache: dict[str, Any]) -> str:
    """The scheduler settings that decide steps, in vLLM's words."""
    def on(key: str, where: dict[str, Any], default: bool) -> str:
        return "on" if where.get(key, default) else "off"

    chunked = on("enable_chunked_prefill", scheduler, True)
    threshold = scheduler.get("long_prefill_token_threshold") or 0
    return (f"{'async' if scheduler.get('async_scheduling') else 'sync'} scheduling, "
            f"{scheduler.get('policy', 'fcfs')}, max_num_seqs {scheduler.get('max_num_seqs')}, "
            f"{scheduler.get('max_num_batched_tokens')} tokens/step, chunked prefill {chunked}"
            + (f" (chunks <= {threshold})" if threshold else "")
            + f", prefix caching {on('enable_prefix_caching', cache, True)}, full-sequence admission "
            f"{on('scheduler_reserve_full_isl', scheduler, False)}")


# The settings that decide a step: every scheduler field, and the cache's shape (not how it was sized).
DECIDING_CACHE_FIELDS = ("block_size", "num_gpu_blocks", "enable_prefix_caching", "watermark")


def config_differences(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[str]:
    """`scheduler.max_num_batched_tokens 2048 vs 8192`, one per scheduling setting both traces record with
    different values: two runs under different settings decide differently for that reason alone."""
    out = []
    for section, only in (("scheduler", None), ("cache", DECIDING_CACHE_FIELDS)):
        a, b = ((m.get("config") or {}).get(section) for m in (meta_a, meta_b))
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        for key in sorted(set(a) & set(b)):
            if (only is None or key in only) and a[key] is not None and b[key] is not None and a[key] != b[key]:
                out.append(f"{section}.{key} {a[key]} vs {b[key]}")
    return out


def describe_replay(source: Any, num_requests: int | None, meta: dict[str, Any], cost: dict[str, Any],
                    scheduler: Any, cache: Any) -> str:
    """What `sim replay` is about to simulate, printed before its numbers: source, model, hardware, cost
    model, KV cache, context length and scheduling mode."""
    from dataclasses import asdict

    sched, kv = asdict(scheduler), meta.get("kv_cache") or {}
    count = f"{num_requests} requests" if num_requests is not None else "requests as they come"
    return "\n".join([
        f"simulating {source} ({count}): {describe_run({'source': 'sim', **meta, 'cost_model': cost})}",
        f"  KV cache {kv.get('num_blocks')} blocks x {kv.get('block_size')} tokens ({kv.get('how')}); "
        f"max_model_len {sched.get('max_model_len')}",
        f"  {scheduling_mode(sched, asdict(cache))}"])
