"""`sim import-run`: a measured vLLM run as a trace directory, so `sim replay`, `sim compare` and the TUI
take a run nobody recorded with stepscope: LLMServingSim's run bundles (`vllm/meta.json` and vLLM's own
per-request stamps in `vllm/requests.jsonl`) and `vllm bench serve --save-result --save-detailed` files.

Such a run has per-request times but no steps or decisions, and records only the engine arguments it was
given: the rest of its scheduler and cache config is filled with that vLLM version's defaults, and
meta.json's `import` entry says which values were recorded and which inferred, and from where.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.bounded_read import read_bounded
from sim.flags import OneLineParser
from workloads.errors import WorkloadError
from workloads.importers import json_lines, read_trace

MAX_META_BYTES = 16 << 20
MAX_REQUESTS_BYTES = 1 << 30
MAX_RESULT_BYTES = 1 << 30
WORKLOAD_FORMAT = "llmservingsim"
WRITE_BATCH = 512  # request rows per record batch: a batch of prompts stays a few MB
STAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")

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
    "seed": ("model", "seed"),
}


@dataclass(slots=True)
class RunRequest:
    """One measured request, its times already on the trace's clock (seconds since the run's start)."""

    request_id: str
    line: int  # the workload row that holds its prompt
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    arrival: float | None
    first_scheduled: float | None
    first_token: float | None
    finish: float | None
    finish_reason: str = "length"
    error: str | None = None
    where: str = ""  # `file: row N` for a token-count mismatch found in the workload


@dataclass(slots=True)
class ImportedRun:
    """What a run file says: its requests and the meta.json entries of the trace."""

    requests: list[RunRequest]
    meta: dict[str, Any]
    workload: Path | None
    arrivals_from_workload: bool = False
    max_tokens_from_workload: bool = False  # a client's result holds what came back, not what it asked for


def _read_bytes(path: Path, limit: int, what: str) -> bytes:
    """A whole small file, refused past `limit` bytes (a run's meta or result is never that large)."""
    try:
        return read_bounded(path, limit, what)
    except ValueError as e:
        raise WorkloadError(path, "file", str(e).removeprefix(f"{path}: ")) from None


def _json_file(path: Path, limit: int, what: str) -> Any:
    try:
        return json.loads(_read_bytes(path, limit, what))
    except UnicodeDecodeError:
        raise WorkloadError(path, "file", "not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise WorkloadError(path, f"line {e.lineno}", f"not valid JSON ({e.msg})") from None


def _number(value: Any, path: Path, where: str, name: str) -> float:
    """A finite number >= 0: a time stamp, a duration or a count."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkloadError(path, where, f"{name} {value!r} is not a number")
    if not math.isfinite(value):
        raise WorkloadError(path, where, f"{name} {value!r} is not a finite number")
    if value < 0:
        raise WorkloadError(path, where, f"{name} {value!r} is negative")
    return float(value)


def _count(value: Any, path: Path, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkloadError(path, where, f"{name} {value!r} is not a token count (an integer >= 0)")
    return value


def _workload_line(request_id: str, path: Path, where: str) -> int:
    """`bench-7` (or vLLM bench's `bench-<hex>-7`) is the workload's row 7: the trailing number."""
    m = re.search(r"(\d+)$", request_id)
    if m is None:
        raise WorkloadError(path, where, f"request_id {request_id!r} does not end in its workload row number")
    return int(m.group(1))


def _resolve_workload(run_dir: Path, meta_path: Path, meta: dict[str, Any], given: str | None) -> Path:
    if given is not None:
        path = Path(given)
        if not path.is_file():
            raise WorkloadError(path, "--workload", "no such file")
        return path
    name = meta.get("dataset_path")
    if not isinstance(name, str) or not name:
        raise WorkloadError(meta_path, "dataset_path", "absent: give the workload the run served with --workload")
    for base in (run_dir.parent, run_dir):
        if (base / name).is_file():
            return base / name
    raise WorkloadError(meta_path, "dataset_path", f"{name!r} is not under {run_dir.parent} or {run_dir}: give "
                        "the workload the run served with --workload")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _config(meta_path: Path, meta: dict[str, Any], hf_config: dict[str, Any] | None) -> tuple[dict, dict]:
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
    _check_config(meta_path, config)
    entry = {"recorded": recorded, "inferred": inferred, "unknown": unknown, "vllm_defaults_of": table_version}
    return config, entry


BOOL_FIELDS = ("enable_chunked_prefill", "async_scheduling", "scheduler_reserve_full_isl", "enable_prefix_caching",
               "enable_expert_parallel")


def _check_config(meta_path: Path, config: dict[str, dict[str, Any]]) -> None:
    """The recorded engine arguments as engine.core's configs take them: a bad one fails here, naming the
    run's meta.json, rather than in a later replay."""
    from engine.core.config import CacheConfig, SchedulerConfig

    names = {name: key for key, (_, name) in KWARGS.items()}
    for section in ("scheduler", "cache", "parallel"):
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


def read_llmservingsim_run(run_dir: Path, workload: str | None = None,
                           hf_config: dict[str, Any] | None = None) -> ImportedRun:
    """An LLMServingSim run bundle: `vllm/meta.json`, `vllm/requests.jsonl`, and the workload it served."""
    meta_path, req_path = run_dir / "vllm" / "meta.json", run_dir / "vllm" / "requests.jsonl"
    meta = _json_file(meta_path, MAX_META_BYTES, "run's meta.json")
    if not isinstance(meta, dict):
        raise WorkloadError(meta_path, "(top level)", "expected a JSON object")
    config, entry = _config(meta_path, meta, hf_config)
    wl = _resolve_workload(run_dir, meta_path, meta, workload)
    digest = meta.get("dataset_hash")
    if isinstance(digest, str) and digest and workload is None and _sha256(wl) != digest.lower():
        raise WorkloadError(wl, "file", f"sha256 differs from the run's dataset_hash ({meta_path}): not the "
                            "workload the run served")
    size = req_path.stat().st_size if req_path.is_file() else None
    if size is None:
        raise WorkloadError(req_path, "file", "no such file (the run's per-request stamps)")
    if size > MAX_REQUESTS_BYTES:
        raise WorkloadError(req_path, "file", f"{size:,} bytes, more than the {MAX_REQUESTS_BYTES:,} allowed")
    raw: list[tuple[int, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for line, row in json_lines(req_path):
        where = f"line {line}"
        for key in ("request_id", "input_toks", "output_toks", *STAMPS):
            if key not in row:
                raise WorkloadError(req_path, where, f"missing field {key!r}")
        rid = row["request_id"]
        if not isinstance(rid, str) or not rid:
            raise WorkloadError(req_path, where, f"request_id {rid!r} is not a non-empty string")
        if rid in seen:
            raise WorkloadError(req_path, where, f"request_id {rid!r} repeats line {seen[rid]}")
        seen[rid] = line
        row["_stamps"] = [_number(row[k], req_path, where, k) for k in STAMPS]
        for earlier, later in zip(STAMPS, STAMPS[1:]):
            if row[later] < row[earlier]:
                raise WorkloadError(req_path, where, f"{later} {row[later]!r} is before {earlier} {row[earlier]!r}")
        row["_counts"] = [_count(row[k], req_path, where, k) for k in ("input_toks", "output_toks")]
        raw.append((line, row))
    if not raw:
        raise WorkloadError(req_path, "file", "no requests")
    t0 = min(row["_stamps"][0] for _, row in raw)
    requests = []
    for line, row in raw:
        queued, scheduled, first, last = (t - t0 for t in row["_stamps"])
        prompt, output = row["_counts"]
        requests.append(RunRequest(request_id=row["request_id"], line=_workload_line(row["request_id"], req_path,
                                                                                    f"line {line}"),
                                   num_prompt_tokens=prompt, num_output_tokens=output, max_tokens=output,
                                   arrival=queued, first_scheduled=scheduled, first_token=first, finish=last,
                                   where=f"{req_path}: line {line}: input_toks"))
    entry["from"] = str(run_dir)
    entry["kind"] = "LLMServingSim run bundle (vllm/meta.json, vllm/requests.jsonl)"
    entry["clock"] = ("vLLM's monotonic stamps (queued_ts, scheduled_ts, first_token_ts, last_token_ts) minus the "
                      "earliest queued_ts; arrival = queued (the wall-clock arrival_time is on another clock)")
    entry["run"] = {k: meta[k] for k in ("started_at", "finished_at", "num_requests", "dataset_hash") if k in meta}
    out_meta = {"source": "vllm", "backend": "vllm", "vllm": {"version": meta["vllm_version"]}, "config": config,
                "device": _device(run_dir), "import": entry}
    return ImportedRun(requests, out_meta, wl)


def _device(run_dir: Path) -> dict[str, Any]:
    """The GPU named by the bundle's LLMServingSim cluster file (`config.json`), when it has one."""
    path = run_dir / "config.json"
    try:
        cluster = json.loads(_read_bytes(path, MAX_META_BYTES, "cluster description")) if path.is_file() else None
        instance = cluster["nodes"][0]["instances"][0]
        return {"type": "cuda", "name": str(instance["hardware"]), "count": int(instance.get("num_npus") or 1)}
    except (WorkloadError, ValueError, KeyError, IndexError, TypeError):
        return {"type": None, "name": None}


def read_bench_result(path: Path, workload: str | None) -> ImportedRun:
    """A `vllm bench serve --save-result --save-detailed` JSON file: per-request `input_lens`,
    `output_lens`, `ttfts`, `itls`, `start_times` (client send times) and `errors`; request i is row i
    of the workload it sent, which gives the prompts. Without `start_times` the workload's arrivals stand in."""
    if workload is None:
        raise WorkloadError(path, "--workload", "required: a bench result does not say which prompts it sent")
    wl = Path(workload)
    if not wl.is_file():
        raise WorkloadError(wl, "--workload", "no such file")
    result = _json_file(path, MAX_RESULT_BYTES, "bench result")
    if not isinstance(result, dict):
        raise WorkloadError(path, "(top level)", "expected a JSON object")
    lists: dict[str, list] = {}
    for key in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors"):
        value = result.get(key)
        if value is None and key in ("start_times", "errors"):
            continue
        if not isinstance(value, list):
            raise WorkloadError(path, key, "absent or not a list (was the benchmark saved with --save-detailed?)")
        lists[key] = value
    n = len(lists["input_lens"])
    if not n:
        raise WorkloadError(path, "input_lens", "no requests")
    for key, value in lists.items():
        if len(value) != n:
            raise WorkloadError(path, key, f"{len(value)} entries, input_lens has {n}")
    starts = [_number(s, path, f"start_times[{i}]", "start time") for i, s in enumerate(lists.get("start_times", []))]
    t0 = min(starts) if starts else 0.0
    errors = lists.get("errors") or [None] * n
    requests = []
    for i in range(n):
        prompt = _count(lists["input_lens"][i], path, f"input_lens[{i}]", "input length")
        output = _count(lists["output_lens"][i], path, f"output_lens[{i}]", "output length")
        ttft = _number(lists["ttfts"][i], path, f"ttfts[{i}]", "ttft")
        itl = lists["itls"][i]
        if not isinstance(itl, list):
            raise WorkloadError(path, f"itls[{i}]", "not a list of inter-token latencies")
        gaps = sum(_number(g, path, f"itls[{i}][{k}]", "inter-token latency") for k, g in enumerate(itl))
        error = errors[i] or None
        if error is not None and not isinstance(error, str):
            raise WorkloadError(path, f"errors[{i}]", f"{error!r} is not a string")
        # A failed request has no first token: vLLM bench leaves its ttft 0 and its output length 0.
        failed = error is not None or (output == 0 and ttft == 0.0)
        arrival = starts[i] - t0 if starts else 0.0  # shifted to the workload's arrival below when no start_times
        requests.append(RunRequest(
            request_id=f"bench-{i}", line=i, num_prompt_tokens=prompt, num_output_tokens=0 if failed else output,
            max_tokens=max(output, 1), arrival=arrival, first_scheduled=None,
            first_token=None if failed else arrival + ttft, finish=None if failed else arrival + ttft + gaps,
            finish_reason="error" if failed else "length",
            error=(error or "no first token") if failed else None, where=f"{path}: input_lens[{i}]"))
    clock = ("client send times (start_times) minus the earliest" if starts else
             "the result has no start_times: arrivals are the workload's arrival_time_ns")
    entry = {"from": str(path), "kind": "vllm bench serve result (--save-result --save-detailed)",
             "recorded": [f"requests.{k}" for k in lists],
             "inferred": {} if starts else {"requests.arrival": "the workload's arrival_time_ns"},
             "unknown": {"config.scheduler": "a bench result records no engine configuration",
                         "config.cache": "a bench result records no engine configuration",
                         "requests.first_scheduled": "a client sees no scheduling"},
             "clock": f"{clock}; first_token = arrival + ttft, finish = first_token + sum(itls)",
             "bench": {k: result[k] for k in ("date", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                                              "request_rate", "burstiness", "max_concurrency", "duration")
                       if k in result}}
    model = result.get("model_id") if isinstance(result.get("model_id"), str) else None
    meta = {"source": "vllm", "backend": "vllm", "vllm": {"version": None},
            "config": {"model": {"model": model, "source": "vllm bench serve"}, "scheduler": {}, "cache": {}},
            "device": {"type": None, "name": None}, "import": entry}
    return ImportedRun(requests, meta, wl, arrivals_from_workload=not starts, max_tokens_from_workload=True)


def _by_row(run: ImportedRun) -> Iterator[tuple[Any, list[RunRequest]]]:
    """(workload TraceRow, the requests it served) in workload order: one pass over the workload, each
    prompt held only while its requests are written."""
    by_line: dict[int, list[RunRequest]] = {}
    for r in run.requests:
        by_line.setdefault(r.line, []).append(r)
    last = max(by_line)
    for index, row in enumerate(read_trace(run.workload, WORKLOAD_FORMAT)):
        if index in by_line:
            yield row, by_line.pop(index)
        if index >= last:
            break
    for line, missing in sorted(by_line.items()):
        r = missing[0]
        raise ValueError(f"{r.where}: {r.request_id}: the workload {run.workload} has no row {line} "
                         f"(its rows are numbered from 0)")


def check_against_workload(run: ImportedRun) -> None:
    """Each request's workload row exists and holds as many prompt tokens as the run says; arrivals and
    max_tokens (vLLM bench asks for the workload's output_toks) come from the workload where the run has
    none. Read before anything is written."""
    for row, served in _by_row(run):
        for r in served:
            if row.prompt_tokens != r.num_prompt_tokens:
                raise ValueError(f"{r.where}: {r.request_id} has {r.num_prompt_tokens} prompt tokens, but row "
                                 f"{r.line} of the workload {run.workload} has {row.prompt_tokens} input_tok_ids")
            if run.max_tokens_from_workload:
                r.max_tokens = row.output_tokens
            if run.arrivals_from_workload:
                r.arrival += row.arrival
                r.first_token = None if r.first_token is None else r.first_token + row.arrival
                r.finish = None if r.finish is None else r.finish + row.arrival


def _trace_rows(run: ImportedRun) -> Iterator[dict[str, Any]]:
    for row, served in _by_row(run):
        for r in served:
            yield {"request_id": r.request_id, "arrival": r.arrival, "queued": r.arrival,
                   "first_scheduled": r.first_scheduled, "first_token": r.first_token, "finish": r.finish,
                   "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_output_tokens,
                   "finish_reason": r.finish_reason, "priority": 0, "max_tokens": r.max_tokens, "error": r.error,
                   "prompt_token_ids": row.prompt_token_ids, "output_token_ids": []}


def check_output_dir(out: Path, overwrite: bool) -> None:
    """A trace directory has one writer and is never replaced unless asked: refuse a non-empty one."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out}: directory exists and is not empty (pass --overwrite to replace the trace in it)")


def write_trace(run: ImportedRun, out: Path, overwrite: bool = False) -> int:
    """The requests table through traces' own writer (no steps, decisions or block events: a measured
    run has none), replacing a trace in `out` only with `overwrite`; returns the number of requests written."""
    from traces.writer import TraceWriter

    meta = {**run.meta, "workload": {"name": run.workload.stem, "arrival": {"process": "trace",
                                                                           "format": WORKLOAD_FORMAT,
                                                                           "path": str(run.workload)}}}
    writer = TraceWriter(out, meta, flush_every=WRITE_BATCH, stream_format="arrow", overwrite=overwrite)
    n = 0
    batch: list[dict[str, Any]] = []
    for row in _trace_rows(run):
        batch.append(row)
        if len(batch) == WRITE_BATCH:
            writer.write_rows("requests", batch)
            writer.drain()
            n += len(batch)
            batch.clear()
    writer.write_rows("requests", batch)
    n += len(batch)
    writer.close(num_steps=0, interrupted=False)
    return n


def _parser() -> OneLineParser:
    p = OneLineParser(prog="sim import-run", description="Bring a measured vLLM run in as a trace directory: an "
                      "LLMServingSim run bundle (RUN_DIR with vllm/meta.json and vllm/requests.jsonl) or a "
                      "`vllm bench serve --save-result --save-detailed` JSON file.")
    p.add_argument("run", metavar="RUN_DIR|RESULT.json")
    p.add_argument("--workload", default=None, metavar="FILE.jsonl",
                   help="the workload the run served (llmservingsim JSONL: arrival_time_ns, input_tok_ids, "
                        "output_toks); default for a run bundle: its meta.json's dataset_path")
    p.add_argument("-o", "--output", required=True, metavar="TRACE_DIR", help="the trace directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace the trace in a non-empty TRACE_DIR")
    p.add_argument("--model-config", default=None, metavar="CONFIG.json",
                   help="the model's Hugging Face config.json: kept as config.model.hf_config (and its "
                        "max_position_embeddings as max_model_len when the run left it unset)")
    return p


def import_run(args: Any) -> int:
    out, src = Path(args.output), Path(args.run)
    check_output_dir(out, args.overwrite)
    hf_config = None
    if args.model_config is not None:
        hf_config = _json_file(Path(args.model_config), MAX_META_BYTES, "model config")
        if not isinstance(hf_config, dict):
            raise WorkloadError(args.model_config, "(top level)", "expected a JSON object (a config.json)")
    if src.is_dir():
        run = read_llmservingsim_run(src, args.workload, hf_config)
    elif src.is_file():
        run = read_bench_result(src, args.workload)
        if hf_config is not None:
            run.meta["config"]["model"]["hf_config"] = hf_config
    else:
        raise ValueError(f"{src}: no such run directory or bench result file")
    check_against_workload(run)
    n = write_trace(run, out, args.overwrite)
    entry = run.meta["import"]
    print(f"imported {n} requests from {src} (workload {run.workload}) into {out}")
    if entry["inferred"]:
        print(f"inferred: {', '.join(sorted(entry['inferred']))} (meta.json import.inferred says from where)")
    if entry["unknown"]:
        print(f"not recorded: {', '.join(sorted(entry['unknown']))} (meta.json import.unknown says why)")
    return 0


def main_import_run(argv: list[str]) -> int:
    """`sim import-run ...`; bad input is one line on stderr and exit status 2."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return import_run(args)
    except ValueError as e:
        print(f"sim import-run: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
