"""The worker owns one device: threads or CUDA context, the model runner, KV sizing on that device."""
from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig, bound_openmp_spin, default_num_threads
from engine.core.outputs import ModelRunnerOutput
from engine.core.sched_output import SchedulerOutput
from engine.model_executor.loader import KVCacheSpec
from engine.worker.model_runner import ModelRunner

logger = logging.getLogger("stepscope")


class Worker:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device_config.device)
        self.model_runner: ModelRunner | None = None
        self.sync_timing = False

    def init_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)  # torch 2.11 refuses a bare "cuda"
            torch.cuda.empty_cache()
        else:
            threads = self.config.device_config.num_threads or default_num_threads()
            if threads > 1 and not bound_openmp_spin():
                logger.warning("torch was loaded before the engine bounded OpenMP spin-waiting "
                               "(engine.config.bound_openmp_spin): %d threads can run far slower than 1 "
                               "beside a busy process", threads)
            torch.set_num_threads(threads)
        torch.manual_seed(self.config.model_config.seed)
        self.model_runner = ModelRunner(self.config, self.device)

    @property
    def runner(self) -> ModelRunner:
        """The model runner, which exists from `init_device` on."""
        if self.model_runner is None:
            raise RuntimeError("Worker: init_device() must come first")
        return self.model_runner

    def describe_device(self) -> dict[str, str | int]:
        """What a trace records about the hardware the run used."""
        import platform

        info: dict[str, str | int] = {"type": self.device.type, "torch": str(torch.__version__)}
        if self.device.type == "cuda":
            info["name"] = torch.cuda.get_device_name(self.device)
            info["memory_bytes"] = torch.cuda.get_device_properties(self.device).total_memory
        else:
            info["name"] = platform.processor() or platform.machine()
            info["num_threads"] = torch.get_num_threads()
        return info

    def load_model(self) -> None:
        self.runner.load_model()

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return self.runner.get_kv_cache_spec()

    def get_kv_bytes_per_block(self) -> int:
        return self.runner.get_kv_bytes_per_block()

    def determine_available_memory(self) -> dict:
        """CUDA: profile a worst-case forward and apply the seed's arithmetic,
        available KV = free memory at start x gpu_memory_utilization - peak memory of the model."""
        if self.device.type != "cuda":
            raise RuntimeError("memory profiling is for CUDA devices; the CPU uses --kv-cache-memory")
        torch.cuda.synchronize(self.device)
        free_at_start, total = torch.cuda.mem_get_info(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.runner.profile_run()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        util = self.config.cache_config.gpu_memory_utilization
        # free_at_start was measured after the weights were loaded: add them back, then take the peak.
        weights = torch.cuda.memory_allocated(self.device)
        budget = (free_at_start + weights) * util
        return {"total": total, "free_at_start": free_at_start + weights, "utilization": util,
                "peak": peak, "available": int(budget - peak)}

    def initialize_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def compile_or_warm_up_model(self) -> None:
        self.runner.warm_up()

    def capture_cudagraphs(self) -> bool:
        return self.runner.capture_cudagraphs()

    def set_sync_timing(self, enabled: bool) -> None:
        """When traced, wait for the device after the forward so the execute span covers the GPU work.
        Not while steps overlap: waiting there would take away the overlap being measured."""
        self.sync_timing = enabled

    def get_step_overlap(self) -> str:
        return self.runner.step_overlap

    def set_step_overlap(self, mode: str) -> None:
        self.runner.set_step_overlap(mode)

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.runner.execute_model(scheduler_output)
        if self.sync_timing and self.device.type == "cuda" and self.runner.step_overlap == "none":
            torch.cuda.synchronize(self.device)

    def sample_tokens(self) -> ModelRunnerOutput:
        return self.runner.sample_tokens()
