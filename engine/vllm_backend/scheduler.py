"""vLLM scheduler subclasses that record every step as a stepscope trace, while vLLM decides.

Pass one to vLLM as `scheduler_cls` (a class, or its qualified name for `vllm serve --scheduler-cls`):
`engine.vllm_backend.scheduler.RecordingScheduler` for synchronous scheduling,
`engine.vllm_backend.scheduler.RecordingAsyncScheduler` with async scheduling (vLLM requires an
AsyncScheduler subclass there). The trace goes to `$STEPSCOPE_TRACE_DIR`; without it the classes
behave exactly as vLLM's own and record nothing. vLLM builds the scheduler inside its engine core
(another process under `vllm serve`), which is why the directory travels as an environment variable.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from engine.vllm_backend import TRACE_DIR_ENV, TRACE_OVERWRITE_ENV
from engine.vllm_backend.meta import trace_meta
from engine.vllm_backend.recorder import VllmStepRecorder


class _Recording(Scheduler):
    """The recording half, shared by both subclasses; every override calls vLLM's method unchanged (the
    next class in the subclass's order: AsyncScheduler for RecordingAsyncScheduler)."""

    stepscope: VllmStepRecorder | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        trace_dir = os.environ.get(TRACE_DIR_ENV)
        overwrite = os.environ.get(TRACE_OVERWRITE_ENV) == "1"
        self.stepscope = VllmStepRecorder(self, trace_dir, trace_meta(self), overwrite=overwrite) if trace_dir else None
        if self.stepscope is not None:
            self._close_at_engine_shutdown()

    def _close_at_engine_shutdown(self) -> None:
        """End the trace where vLLM's engine core starts to shut down: its first act, releasing the
        structured-output backend, comes before it stops its workers and long before it calls the
        scheduler's `shutdown()`. `vllm serve` gives the engine core process 0 s by default
        (--shutdown-timeout) between SIGTERM and SIGKILL, so by `shutdown()` it is usually gone."""
        manager = self.structured_output_manager
        release = manager.clear_backend

        def clear_backend() -> None:
            self.close_trace(compact=False)
            release()

        # An attribute of this instance shadows the class's method: the engine core calls it through the
        # same object, and no other manager is touched.
        vars(manager)["clear_backend"] = clear_backend

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        if self.stepscope is not None and request.request_id not in self.stepscope.requests:
            self.stepscope.on_add(request)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if self.stepscope is None:
            return super().schedule(*args, **kwargs)
        start = time.monotonic()
        so = super().schedule(*args, **kwargs)
        self.stepscope.on_schedule(so, start, time.monotonic())
        return so

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        if self.stepscope is not None:
            self.stepscope.on_execute_end(time.monotonic())
        return super().get_grammar_bitmask(scheduler_output)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> dict[int, EngineCoreOutputs]:
        if self.stepscope is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        start = time.monotonic()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.stepscope.on_update(outputs, start, time.monotonic())
        return outputs

    def finish_requests(self, request_ids: str | Iterable[str] | None,
                        finished_status: RequestStatus) -> list[Request]:
        ended = super().finish_requests(request_ids, finished_status)
        if self.stepscope is not None:
            reason = str(RequestStatus.get_finished_reason(finished_status))
            self.stepscope.on_abort(lambda rid: reason)
        return ended

    def shutdown(self) -> None:
        # Normally closed already (above); the engine core process has little time left either way, so
        # no Parquet compaction: the Arrow streams are a complete trace too.
        self.close_trace(compact=False)
        super().shutdown()

    def close_trace(self, **final_meta: Any) -> None:
        """Write the last rows and compact the trace; a second call does nothing."""
        if self.stepscope is not None:
            rec, self.stepscope = self.stepscope, None
            rec.close(**final_meta)


class RecordingScheduler(_Recording):
    """vLLM's synchronous `Scheduler`, recorded."""


class RecordingAsyncScheduler(_Recording, AsyncScheduler):
    """vLLM's `AsyncScheduler` (step k+1 scheduled before step k's output is applied), recorded."""
