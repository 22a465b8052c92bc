"""What a measured vLLM run's files say, read as they are: LLMServingSim's run bundles (`vllm/meta.json`
and vLLM's own per-request stamps in `vllm/requests.jsonl`) and `vllm bench serve --save-result
--save-detailed` files. Every field is checked where it is read (finite, within what any run could
record, consistent with the meta's counts and the workload's hash): a contradiction is one line naming
file, row and field."""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.bounded_read import read_bounded
from sim.fidelity.vllm_defaults import run_config
from workloads.errors import WorkloadError
from workloads.importers import MAX_TOKENS, json_lines
from workloads.spec import MAX_REQUESTS

MAX_META_BYTES = 16 << 20
MAX_REQUESTS_BYTES = 1 << 30
MAX_RESULT_BYTES = 1 << 30
WORKLOAD_FORMAT = "llmservingsim"
STAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
# A clock stamp past this is no clock's: epoch seconds stay below it until the year 2286, a monotonic clock far longer.
MAX_STAMP = 1e10
# A request that waits or generates for over three years (1e8 s) was not measured: a corrupt or mistyped number.
MAX_LATENCY = 1e8
SHA256 = re.compile(r"[0-9a-fA-F]{64}")
# vLLM bench's run-level figures copied into meta.json; the counts among them are bounded as request counts.
BENCH_FIGURES = ("num_prompts", "request_rate", "burstiness", "max_concurrency", "duration")
BENCH_COUNTS = ("num_prompts", "max_concurrency")

@dataclass(slots=True)
class RunRequest:
    """One measured request, its times already on the trace's clock (seconds since the run's start)."""

    request_id: str
    line: int  # the workload row that holds its prompt
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finish: float | None
    finish_reason: str = "length"
    error: str | None = None
    # (file, `row: field`) of its prompt and its output length, for a mismatch found in the workload
    prompt_at: tuple[str, str] = ("", "")
    output_at: tuple[str, str] = ("", "")


@dataclass(slots=True)
class ImportedRun:
    """What a run file says: its requests and the meta.json entries of the trace."""

    requests: list[RunRequest]
    meta: dict[str, Any]
    workload: Path
    arrivals_from_workload: bool = False
    max_tokens_from_workload: bool = False  # a client's result holds what came back, not what it asked for


def _read_bytes(path: Path, limit: int, what: str) -> bytes:
    """A whole small file, refused past `limit` bytes (a run's meta or result is never that large)."""
    try:
        return read_bounded(path, limit, what)
    except ValueError as e:
        raise WorkloadError(path, "file", str(e).removeprefix(f"{path}: ")) from None


def json_file(path: Path, limit: int, what: str) -> Any:
    try:
        return json.loads(_read_bytes(path, limit, what))
    except UnicodeDecodeError:
        raise WorkloadError(path, "file", "not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise WorkloadError(path, f"line {e.lineno}", f"not valid JSON ({e.msg})") from None


def _non_negative(value: Any, path: Path, where: str, name: str = "") -> float:
    """A finite number >= 0 (`name`, when given, leads the message)."""
    said = f"{name} {value!r}" if name else repr(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkloadError(path, where, f"{said} is not a number")
    if not math.isfinite(value):
        raise WorkloadError(path, where, f"{said} is not a finite number")
    if value < 0:
        raise WorkloadError(path, where, f"{said} is negative")
    return float(value)


def _number(value: Any, path: Path, where: str, name: str, limit: float) -> float:
    """A finite number in [0, limit] seconds: a clock stamp (MAX_STAMP) or a latency (MAX_LATENCY)."""
    _non_negative(value, path, where, name)
    if value > limit:
        raise WorkloadError(path, where, f"{name} {value!r} is more than {limit:g} s, longer than any run")
    return float(value)


def _count(value: Any, path: Path, where: str, name: str) -> int:
    """A token count, at most any model's context: a larger one is a corrupt number, not a request."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkloadError(path, where, f"{name} {value!r} is not a token count (an integer >= 0)")
    if value > MAX_TOKENS:
        raise WorkloadError(path, where, f"{name} {value!r} is more than any model's context (at most {MAX_TOKENS})")
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


def _declared_requests(meta_path: Path, meta: dict[str, Any]) -> int | None:
    """meta.json's num_requests, the count requests.jsonl must hold; None where the run left it out."""
    n = meta.get("num_requests")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REQUESTS):
        raise WorkloadError(meta_path, "num_requests", f"{n!r} is not a request count (an integer in "
                            f"[1, {MAX_REQUESTS:,}])")
    return n


def _check_dataset_hash(meta_path: Path, meta: dict[str, Any], workload: Path, given: bool) -> None:
    """The workload is the one the run hashed, whenever the run recorded a hash: a workload given with
    --workload as much as the one its dataset_path names."""
    digest = meta.get("dataset_hash")
    if digest is None or digest == "":
        return
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise WorkloadError(meta_path, "dataset_hash", f"{digest!r} is not a sha256 digest (64 hex digits)")
    if _sha256(workload) != digest.lower():
        raise WorkloadError(workload, "--workload" if given else "file", f"sha256 differs from the run's "
                            f"dataset_hash ({meta_path}): not the workload the run served")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def read_llmservingsim_run(run_dir: Path, workload: str | None = None,
                           hf_config: dict[str, Any] | None = None) -> ImportedRun:
    """An LLMServingSim run bundle: `vllm/meta.json`, `vllm/requests.jsonl`, and the workload it served."""
    meta_path, req_path = run_dir / "vllm" / "meta.json", run_dir / "vllm" / "requests.jsonl"
    meta = json_file(meta_path, MAX_META_BYTES, "run's meta.json")
    if not isinstance(meta, dict):
        raise WorkloadError(meta_path, "(top level)", "expected a JSON object")
    config, entry = run_config(meta_path, meta, hf_config)
    declared = _declared_requests(meta_path, meta)
    wl = _resolve_workload(run_dir, meta_path, meta, workload)
    _check_dataset_hash(meta_path, meta, wl, workload is not None)
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
        row["_stamps"] = [_number(row[k], req_path, where, k, MAX_STAMP) for k in STAMPS]
        for earlier, later in zip(STAMPS, STAMPS[1:]):
            if row[later] < row[earlier]:
                raise WorkloadError(req_path, where, f"{later} {row[later]!r} is before {earlier} {row[earlier]!r}")
        row["_counts"] = [_count(row[k], req_path, where, k) for k in ("input_toks", "output_toks")]
        raw.append((line, row))
    if not raw:
        raise WorkloadError(req_path, "file", "no requests")
    if declared is not None and len(raw) < declared:
        raise WorkloadError(req_path, f"line {raw[-1][0]}: num_requests", f"the file ends after {len(raw)} requests, "
                            f"but {meta_path} declares {declared} (a run cut short, or a truncated copy?)")
    if declared is not None and len(raw) > declared:
        raise WorkloadError(req_path, f"line {raw[declared][0]}: num_requests", f"request {declared + 1}, but "
                            f"{meta_path} declares {declared}")
    t0 = min(row["_stamps"][0] for _, row in raw)
    requests = []
    for line, row in raw:
        queued, scheduled, first, last = (t - t0 for t in row["_stamps"])
        prompt, output = row["_counts"]
        requests.append(RunRequest(request_id=row["request_id"], line=_workload_line(row["request_id"], req_path,
                                                                                    f"line {line}"),
                                   num_prompt_tokens=prompt, num_output_tokens=output, max_tokens=output,
                                   arrival=queued, first_scheduled=scheduled, first_token=first, finish=last,
                                   prompt_at=(str(req_path), f"line {line}: input_toks"),
                                   output_at=(str(req_path), f"line {line}: output_toks")))
    entry["from"] = str(run_dir)
    entry["kind"] = "LLMServingSim run bundle (vllm/meta.json, vllm/requests.jsonl)"
    entry["clock"] = ("vLLM's monotonic stamps (queued_ts, scheduled_ts, first_token_ts, last_token_ts) minus the "
                      "earliest queued_ts; arrival = queued (the wall-clock arrival_time is on another clock)")
    entry["run"] = {k: meta[k] for k in ("started_at", "finished_at", "num_requests", "dataset_hash") if k in meta}
    out_meta = {"source": "vllm", "backend": "vllm", "vllm": {"version": meta["vllm_version"]}, "config": config,
                "device": _device(run_dir, meta), "import": entry}
    return ImportedRun(requests, out_meta, wl)


def _device(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The GPU the run recorded (meta's `hardware`: device name and count as torch saw them), else the one
    named by the bundle's LLMServingSim cluster file (`config.json`), when it has one."""
    hardware = meta.get("hardware")
    if isinstance(hardware, dict) and isinstance(hardware.get("device_name"), str):
        count = hardware.get("device_count")
        return {"type": "cuda", "name": hardware["device_name"],
                "count": count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None,
                "memory_bytes": hardware.get("device_total_memory_bytes")}
    path = run_dir / "config.json"
    unknown: dict[str, Any] = {"type": None, "name": None}
    if not path.is_file():
        return unknown
    try:
        instance = json.loads(_read_bytes(path, MAX_META_BYTES, "cluster description"))["nodes"][0]["instances"][0]
        return {"type": "cuda", "name": str(instance["hardware"]), "count": int(instance.get("num_npus") or 1)}
    except (WorkloadError, ValueError, KeyError, IndexError, TypeError):
        return unknown


def read_bench_result(path: Path, workload: str | None) -> ImportedRun:
    """A `vllm bench serve --save-result --save-detailed` JSON file: per-request `input_lens`,
    `output_lens`, `ttfts`, `itls`, `start_times` (client send times) and `errors`; request i is row i
    of the workload it sent, which gives the prompts. Without `start_times` the workload's arrivals stand in."""
    if workload is None:
        raise WorkloadError(path, "--workload", "required: a bench result does not say which prompts it sent")
    wl = Path(workload)
    if not wl.is_file():
        raise WorkloadError(wl, "--workload", "no such file")
    result = json_file(path, MAX_RESULT_BYTES, "bench result")
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
    starts = [_number(s, path, f"start_times[{i}]", "start time", MAX_STAMP)
              for i, s in enumerate(lists.get("start_times", []))]
    t0 = min(starts) if starts else 0.0
    errors = lists.get("errors") or [None] * n
    requests = []
    for i in range(n):
        prompt = _count(lists["input_lens"][i], path, f"input_lens[{i}]", "input length")
        output = _count(lists["output_lens"][i], path, f"output_lens[{i}]", "output length")
        ttft = _number(lists["ttfts"][i], path, f"ttfts[{i}]", "ttft", MAX_LATENCY)
        itl = lists["itls"][i]
        if not isinstance(itl, list):
            raise WorkloadError(path, f"itls[{i}]", "not a list of inter-token latencies")
        gaps = sum(_number(g, path, f"itls[{i}][{k}]", "inter-token latency", MAX_LATENCY) for k, g in enumerate(itl))
        if gaps > MAX_LATENCY:
            raise WorkloadError(path, f"itls[{i}]", f"inter-token latencies sum to {gaps:g} s, more than "
                                f"{MAX_LATENCY:g} s, longer than any run")
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
            error=(error or "no first token") if failed else None, prompt_at=(str(path), f"input_lens[{i}]"),
            output_at=(str(path), f"output_lens[{i}]")))
    _check_bench_figures(path, result)
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


def _check_bench_figures(path: Path, result: dict[str, Any]) -> None:
    """The run-level figures meta.json keeps: numbers finite and >= 0, counts bounded (a string, such as
    vLLM's "inf" for an unlimited rate, is kept as written)."""
    for key in BENCH_FIGURES:
        value = result.get(key)
        if value is None or isinstance(value, str):
            continue
        _non_negative(value, path, key)
        if key in BENCH_COUNTS and (not isinstance(value, int) or value > MAX_REQUESTS):
            raise WorkloadError(path, key, f"{value!r} is not a request count (an integer in [0, {MAX_REQUESTS:,}])")
