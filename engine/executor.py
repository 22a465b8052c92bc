"""Executor: the seam between EngineCore and workers. One process, one worker, direct calls; the
`collective_rpc` name stays so a multi-worker executor can slot in behind the same interface."""
from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.core.outputs import ModelRunnerOutput
from engine.core.sched_output import SchedulerOutput


class UniProcExecutor:
    def __init__(self, config: EngineConfig) -> None:
        from engine.worker.worker import Worker

        self.config = config
        self.driver_worker = Worker(config)
        self.collective_rpc("init_device")
        self.collective_rpc("load_model")

    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(self.driver_worker, method)(*args, **kwargs)]

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.driver_worker.execute_model(scheduler_output)

    def sample_tokens(self) -> ModelRunnerOutput:
        return self.driver_worker.sample_tokens()
