"""EngineCore: the backend loop. Start-up loads the model and sizes the KV cache ("Prepare model");
each `step` is engine.core's StepCycle (schedule -> execute -> sample -> update -> record) over the
executor, the same cycle the simulator runs over its cost models."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineConfig
from engine.core.outputs import EngineCoreOutputs
from engine.core.request import RefusedRequest, Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.core.async_scheduler import make_scheduler
from engine.core.step_cycle import StepCycle
from engine.executor import UniProcExecutor

if TYPE_CHECKING:  # engine.tracing loads the span exporter's dependencies: only where a run is traced
    from engine.tracing import EngineTrace

logger = logging.getLogger("stepscope")


@dataclass(slots=True, kw_only=True)
class EngineCoreRequest:
    """What the frontend sends: token ids and validated params, never text."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None


@dataclass(slots=True, kw_only=True)
class KVCacheReport:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    max_concurrency: float
    how: str

    @property
    def num_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size


class EngineCore:
    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.t0 = clock()
        # (name, start, end) on `clock`: the children of the "Prepare model" span.
        self.startup_phases: list[tuple[str, float, float]] = []
        with self._phase("load weights"):
            self.executor = UniProcExecutor(config)
        self.kv_report = self._initialize_kv_caches()
        config.cache_config.num_gpu_blocks = self.kv_report.num_blocks
        sc = config.scheduler_config
        self.scheduler = make_scheduler(sc, config.cache_config, clock)
        # Async scheduling: vLLM's batch queue of two. The runner launches each batch without waiting for
        # it (model_runner_output says how), so step k+1 is scheduled and prepared while step k runs.
        self.cycle = StepCycle(self.scheduler, self.executor, clock,
                               batch_queue_size=2 if sc.async_scheduling else 1)
        self.trace: EngineTrace | None = None

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Time one start-up phase for the "Prepare model" span (a phase that yields [False] is left
        out) and turn a device out-of-memory into advice on which flag to change."""
        start = self.clock()
        outcome: list[bool] = []
        try:
            yield outcome
        except Exception as e:
            if type(e).__name__ == "OutOfMemoryError":
                raise ValueError(
                    f"{name}: out of device memory; lower --gpu-memory-utilization, --max-num-batched-tokens, "
                    f"--max-num-seqs or --max-model-len (or set --num-gpu-blocks-override / --enforce-eager)"
                ) from None
            raise
        if outcome != [False]:
            self.startup_phases.append((name, start, self.clock()))

    def _initialize_kv_caches(self) -> KVCacheReport:
        cc = self.config.cache_config
        with self._phase("profile memory and size KV cache"):
            per_block = self.executor.collective_rpc("get_kv_bytes_per_block")[0]
            if cc.num_gpu_blocks_override is not None:
                num_blocks, how = cc.num_gpu_blocks_override, "--num-gpu-blocks-override"
            elif self.config.device_config.device.startswith("cuda") and cc.kv_cache_memory is None:
                mem = self.executor.collective_rpc("determine_available_memory")[0]
                num_blocks = max(mem["available"], 0) // per_block
                how = (f"({mem['free_at_start'] / 2**30:.2f} GiB free x {mem['utilization']} - "
                       f"{mem['peak'] / 2**30:.2f} GiB peak) / {per_block / 2**10:.0f} KiB per block")
            else:
                budget = cc.kv_cache_memory or DEFAULT_CPU_KV_CACHE_MEMORY
                num_blocks, how = budget // per_block, f"{budget / 2**30:.2f} GiB / {per_block / 2**10:.0f} KiB per block"
        max_len = self.config.scheduler_config.max_model_len
        need = -(-max_len // cc.block_size) + 1
        if num_blocks < need:
            raise ValueError(
                f"KV cache: {num_blocks} blocks ({max(num_blocks - 1, 0) * cc.block_size} tokens) cannot hold one "
                f"max_model_len={max_len} sequence; raise --kv-cache-memory, --gpu-memory-utilization or "
                f"--num-gpu-blocks-override, or lower --max-model-len")
        with self._phase("allocate KV cache"):
            self.executor.collective_rpc("initialize_cache", num_blocks)
        with self._phase("warm up"):
            self.executor.collective_rpc("compile_or_warm_up_model")
        with self._phase("capture CUDA graphs") as captured:
            captured.append(self.executor.collective_rpc("capture_cudagraphs")[0])
        report = KVCacheReport(num_blocks=num_blocks, block_size=cc.block_size, bytes_per_block=per_block,
                               max_concurrency=(num_blocks - 1) * cc.block_size / max_len, how=how)
        # Usable blocks, as the scheduler, the trace's kv_blocks_total and the TUI count them: one is the null block.
        logger.info("KV cache: %d usable blocks of %d tokens (%d tokens; +1 null block, %.2f GiB in all) = %s; "
                    "max concurrency at max_model_len %d: %.2fx", num_blocks - 1, cc.block_size, report.num_tokens,
                    num_blocks * per_block / 2**30, how, max_len, report.max_concurrency)
        return report

    def enable_tracing(self, trace_dir: str | None, meta: dict, otlp_endpoint: str | None = None,
                       overwrite: bool = False) -> None:
        """Write this run's trace directory and spans from now on (start-up spans included)."""
        from engine.tracing import EngineTrace

        # step_overlap: how the live engine ran steps ("none"; under async scheduling "launch", which overlaps
        # on CUDA, or "thread", a CPU worker thread), since the config's async_scheduling alone does not say.
        overlap = self.executor.collective_rpc("get_step_overlap")[0]
        meta = {"source": "engine", "config": self.config.to_dict(), "kv_cache": dataclasses.asdict(self.kv_report),
                "step_overlap": overlap, **meta}
        trace = EngineTrace(trace_dir, meta, self.scheduler, self.t0, self.config.model_config.model,
                            otlp_endpoint, overwrite)
        trace.spans.prepare_model(self.startup_phases)
        self.trace = trace
        self.cycle.recorder = trace
        self.executor.collective_rpc("set_sync_timing", True)

    def set_step_overlap(self, mode: str) -> None:
        """How the runner launches steps (engine.worker.model_runner_output), between steps; a trace
        being written learns of the change."""
        self.executor.collective_rpc("set_step_overlap", mode)
        if self.trace is not None:
            self.trace.update_meta(step_overlap=mode)

    def add_request(self, request: EngineCoreRequest) -> None:
        req = Request(request.request_id, request.prompt_token_ids, request.sampling_params,
                      eos_token_id=request.eos_token_id, arrival_time=request.arrival_time,
                      priority=request.priority, cache_salt=request.cache_salt)
        self.cycle.add_request(req)

    def record_rejection(self, request_id: str, prompt_token_ids: list[int], arrival_time: float,
                         reason: str, num_prompt_tokens: int | None = None) -> None:
        """A request the frontend refused (bad prompt or params) still belongs in the trace, with its
        prompt's length where its ids were never made."""
        if self.trace is None:
            return
        params = SamplingParams(max_tokens=None)
        req = (Request(request_id, prompt_token_ids, params, arrival_time=arrival_time) if num_prompt_tokens is None
               else RefusedRequest(request_id, num_prompt_tokens, params, arrival_time=arrival_time))
        req.status = RequestStatus.FINISHED_ERROR
        req.error = reason
        req.queued_time = req.finished_time = self.clock()
        self.trace.on_add(req)

    def abort_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
                       stop_reason: int | str | None = None) -> None:
        if self.trace is None:
            self.scheduler.finish_requests(request_ids, status, stop_reason)
            return
        self.trace.on_abort(self.scheduler.finish_requests(request_ids, status, stop_reason))

    def has_work(self) -> bool:
        return self.cycle.has_work() or bool(self.cycle.in_flight)

    @property
    def num_steps(self) -> int:
        return self.cycle.num_steps

    @property
    def num_preemptions(self) -> int:
        return self.cycle.num_preemptions

    def step(self) -> EngineCoreOutputs:
        """One engine step; returns the tokens and finishes it produced."""
        return self.cycle.step()

    def flush_trace(self) -> None:
        """Write out what the trace holds (the engine is idle)."""
        if self.trace is not None:
            self.trace.flush()

    def shutdown(self, **final_meta) -> None:
        trace, self.trace, self.cycle.recorder = self.trace, None, None
        if trace is not None:
            trace.close(**final_meta)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()


class InprocClient:
    """EngineCoreClient for one process: direct calls, so LLMEngine never touches EngineCore itself."""

    def __init__(self, config: EngineConfig) -> None:
        self.engine_core = EngineCore(config)
        obs = config.observability_config
        if obs.enabled:
            device = self.engine_core.executor.collective_rpc("describe_device")[0]
            self.engine_core.enable_tracing(obs.trace_dir, {"device": device}, obs.otlp_traces_endpoint,
                                            obs.overwrite_trace)

    def record_rejection(self, request_id: str, prompt_token_ids: list[int], arrival_time: float,
                         reason: str, num_prompt_tokens: int | None = None) -> None:
        self.engine_core.record_rejection(request_id, prompt_token_ids, arrival_time, reason, num_prompt_tokens)

    def update_trace_meta(self, **fields) -> None:
        if self.engine_core.trace is not None:
            self.engine_core.trace.update_meta(**fields)

    def flush_trace(self) -> None:
        self.engine_core.flush_trace()

    def shutdown(self, **final_meta) -> None:
        self.engine_core.shutdown(**final_meta)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def abort_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED,
                       stop_reason: int | str | None = None) -> None:
        self.engine_core.abort_requests(request_ids, status, stop_reason)

    def has_work(self) -> bool:
        return self.engine_core.has_work()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()
