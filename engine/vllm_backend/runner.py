"""`engine run --backend vllm`: the same workload as the stepscope engine, on the wall clock, through
vLLM's own `LLMEngine` with a recording scheduler, into the same trace directory format.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the run can reach its
scheduler: to date time zero at the run's start, add the workload to meta.json and close the trace.
Requests go through `engine.workload_driver.run_workload`, so both backends see the very same prompts and times.
"""
from __future__ import annotations

import os
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from engine.vllm_backend import TRACE_DIR_ENV, TRACE_OVERWRITE_ENV
from traces.console import trace_line

# vLLM's CPU attention takes blocks in multiples of 32 tokens.
CPU_BLOCK_SIZE = 32


class VllmEngineAdapter:
    """vLLM's LLMEngine under the names `run_workload` drives (stepscope's add_request/step)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.vocab_size: int = engine.model_config.hf_config.vocab_size
        self.max_model_len: int = engine.model_config.max_model_len
        self._rejected: list[Any] = []
        self.wall_minus_mono = time.time() - time.monotonic()

    @property
    def scheduler(self) -> Any:
        return self.engine.engine_core.engine_core.scheduler

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any, arrival_time: float) -> None:
        from vllm import SamplingParams

        from vllm.exceptions import VLLMValidationError

        ids = list(prompt["prompt_token_ids"])
        vparams = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                 ignore_eos=params.ignore_eos)
        try:
            self.engine.add_request(request_id, {"prompt_token_ids": ids}, vparams,
                                    arrival_time=arrival_time + self.wall_minus_mono)
        except (VLLMValidationError, ValueError) as e:
            # vLLM refuses it before its scheduler sees it (e.g. a prompt that leaves no room for an output
            # token): this request fails alone, and the trace says why, as the stepscope engine's does.
            self.scheduler.stepscope.on_reject(request_id, ids, arrival_time, str(e).split(". ")[0])
            self._rejected.append(request_id)

    def refuse_long_prompt(self, request_id: str, num_prompt_tokens: int, arrival_time: float) -> None:
        """Said as vLLM's input processor says it (vllm/v1/engine/input_processor.py), first sentence."""
        reason = (f"The decoder prompt (length {num_prompt_tokens}) is longer than the maximum model length "
                  f"of {self.max_model_len}")
        self.scheduler.stepscope.on_reject(request_id, [], arrival_time, reason, num_prompt_tokens)
        self._rejected.append(request_id)

    def idle(self) -> None:
        """Nothing to do: the recorder wrote its rows out when vLLM ran out of requests."""

    def has_unfinished_requests(self) -> bool:
        return bool(self._rejected) or self.engine.has_unfinished_requests()

    def step(self) -> list[Any]:
        """The requests that finished: vLLM's finished outputs, and the ids of those vLLM refused."""
        rejected, self._rejected = self._rejected, []
        if not self.engine.has_unfinished_requests():
            return rejected
        return rejected + [o for o in self.engine.step() if o.finished]


def vllm_engine_kwargs(args: Namespace, model_dir: str) -> dict[str, Any]:
    """stepscope's engine flags under vLLM's EngineArgs names (the same names, mostly)."""
    kw: dict[str, Any] = {
        "model": model_dir, "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens, "block_size": args.block_size,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
        "enable_prefix_caching": args.enable_prefix_caching, "enable_chunked_prefill": args.enable_chunked_prefill,
        "long_prefill_token_threshold": args.long_prefill_token_threshold, "scheduling_policy": args.scheduling_policy,
        "seed": args.seed, "dtype": "float32" if args.dtype == "auto" else args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "enforce_eager": True, "gpu_memory_utilization": min(args.gpu_memory_utilization, 0.2),
        "kv_cache_memory_bytes": args.kv_cache_memory or (64 << 20),
        "scheduler_cls": "engine.vllm_backend.scheduler.RecordingScheduler", "disable_log_stats": True}
    for flag in ("async_scheduling", "scheduler_reserve_full_isl"):
        if getattr(args, flag, None) is not None:
            kw[flag] = getattr(args, flag)
    if kw.get("async_scheduling"):
        kw["scheduler_cls"] = "engine.vllm_backend.scheduler.RecordingAsyncScheduler"
    return {k: v for k, v in kw.items() if v is not None}


def build_vllm_engine(engine_kwargs: dict[str, Any], trace_dir: str | Path,
                      overwrite: bool = False) -> VllmEngineAdapter:
    """An in-process vLLM engine (vLLM EngineArgs as `engine_kwargs`) whose scheduler records into
    `trace_dir` (replacing a trace there only with `overwrite`); request ids are kept as given, so the
    trace names the workload's requests."""
    from traces.trace_dir import TraceDirLock

    TraceDirLock(trace_dir, overwrite).release()  # refuse before vLLM starts, not from inside its scheduler
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"
    os.environ[TRACE_DIR_ENV] = str(trace_dir)
    os.environ[TRACE_OVERWRITE_ENV] = "1" if overwrite else "0"
    try:
        from vllm import EngineArgs, LLMEngine
    except ImportError as e:
        raise ValueError(f"--backend vllm: vLLM is not installed ({e}); pip install 'stepscope[vllm]'") from None
    try:
        engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
    finally:
        del os.environ[TRACE_DIR_ENV], os.environ[TRACE_OVERWRITE_ENV]
    return VllmEngineAdapter(engine)


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def main_run_vllm(args: Namespace, workload: Any) -> int:
    """`engine run --backend vllm`; with no --model the built-in model, saved as a checkpoint first."""
    from engine.workload_driver import CPU_SCALE, run_workload
    from traces.summary import trace_summary

    if getattr(args, "block_size", None) == 16:  # stepscope's default, which vLLM-CPU refuses
        args.block_size = CPU_BLOCK_SIZE
    tmp_model = None
    model_dir = args.model
    if model_dir is None:
        from engine.vllm_backend.checkpoint import save_builtin_checkpoint

        tmp_model = tempfile.TemporaryDirectory(prefix="stepscope-builtin-")
        model_dir = str(save_builtin_checkpoint(tmp_model.name, args.seed))
    elif not Path(model_dir).is_dir():
        raise ValueError(f"--model: {model_dir}: --backend vllm needs a local checkpoint directory")
    tmp = None
    trace_dir = args.trace
    if not trace_dir:
        tmp = tempfile.TemporaryDirectory(prefix="stepscope-vllm-")
        trace_dir = tmp.name
    engine = build_vllm_engine(vllm_engine_kwargs(args, model_dir), trace_dir, args.overwrite)
    if args.workload is None and _vllm_on_cpu():
        workload = workload.scaled(**CPU_SCALE)  # the same default workload as the stepscope engine on CPU
    sched = engine.scheduler
    writer = sched.stepscope.writer
    if tmp_model is not None:  # named as the stepscope engine names it, not by a directory gone after the run
        config = writer.meta["config"]
        config["model"] = {**config["model"], "model": "builtin", "source": "builtin", "seed": args.seed}
    writer.update_meta(workload={**workload.to_dict(), "time_scale": args.time_scale,
                                 "max_requests": args.max_requests})
    sched.stepscope.set_t0(time.monotonic())
    result = run_workload(engine, workload, args.time_scale, args.max_requests, progress=not args.no_progress)
    sched.close_trace(interrupted=result.interrupted, wall_time=result.wall_time)
    print(trace_summary(trace_dir))
    if tmp is None:
        print(trace_line(trace_dir))
    else:
        tmp.cleanup()
    if tmp_model is not None:
        tmp_model.cleanup()
    return 130 if result.interrupted else 0
