"""One engine step, written once: add -> schedule -> execute -> update -> record.

The live engine, the simulator and each simulated replica are thin shells over `StepCycle`; they differ
only in the runner (a model on a device, or fake tokens) and the clock (the wall clock, or simulated
time that the shell moves while a step runs), so engine/simulator parity holds by construction.

A step is split where a device would run it: `begin` schedules and launches the batch, `finish` waits
for its tokens, applies them and records the step. With async scheduling (vLLM 0.32's engine core batch
queue of two) the next step begins before the previous one finishes.
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.core.outputs import EngineCoreOutput, EngineCoreOutputs, ModelRunnerOutput
from engine.core.request import Request, RequestStatus
from engine.core.sched_output import SchedulerOutput
from engine.core.scheduler import Scheduler

# (schedule starts, execute starts, sample starts, update starts, step ends), on the cycle's clock.
StepTimes = tuple[float, float, float, float, float]
logger = logging.getLogger("stepscope")


class StepRunner(Protocol):
    """The model side: launch a batch, then block for its sampled tokens (vLLM's executor split)."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> None: ...

    def sample_tokens(self) -> ModelRunnerOutput: ...


class StepCost(Protocol):
    """What a simulated step was priced at: device time, then host time after it."""

    @property
    def device(self) -> float: ...

    @property
    def host(self) -> float: ...


class StepRecorder(Protocol):
    def on_add(self, request: Request) -> None: ...

    def on_step(self, step: int, so: SchedulerOutput, outputs: EngineCoreOutputs, times: StepTimes,
                cost: StepCost | None = None) -> object: ...

    def on_abort(self, freed: dict[str, list[int]]) -> object: ...


@dataclass(slots=True)
class InFlightStep:
    """A step launched and not yet finished: its output, when it was scheduled and launched, the runner's
    error if launching raised, and the price a simulator put on it."""

    so: SchedulerOutput
    t_schedule: float
    t_execute: float
    error: Exception | None = None
    cost: StepCost | None = None


class StepCycle:
    """Owns the order of a step's calls and their count; `batch_queue_size` 2 is async scheduling, 1
    synchronous."""

    def __init__(self, scheduler: Scheduler, runner: StepRunner, clock: Callable[[], float],
                 recorder: StepRecorder | None = None, batch_queue_size: int = 1) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.recorder = recorder
        self.batch_queue_size = batch_queue_size
        self.in_flight: deque[InFlightStep] = deque()
        self.num_steps = 0  # steps finished: the number the next one to finish is recorded under
        self.num_preemptions = 0

    def add_request(self, request: Request) -> bool:
        accepted = self.scheduler.add_request(request)
        if self.recorder is not None:
            self.recorder.on_add(request)
        return accepted

    def has_work(self) -> bool:
        s = self.scheduler
        return s.has_unfinished_requests() or s.has_pending_outputs()

    def begin(self) -> InFlightStep:
        """Schedule a step and hand its batch to the runner."""
        t_sched = self.clock()
        so = self.scheduler.schedule()
        step = InFlightStep(so, t_sched, self.clock())
        try:
            self.runner.execute_model(so)
        except Exception as e:  # the step fails alone, see `_fail`
            step.error = e
        self.in_flight.append(step)
        return step

    def finish(self) -> tuple[SchedulerOutput, EngineCoreOutputs]:
        """Wait for the oldest step in flight, apply its tokens and record it."""
        step = self.in_flight.popleft()
        so = step.so
        clock = self.clock
        t_sample = clock()
        try:
            if step.error is not None:
                raise step.error
            runner_output = self.runner.sample_tokens()
        except Exception as e:
            return so, self._fail(step, e, t_sample)
        t_update = clock()
        outputs = self.scheduler.update_from_output(so, runner_output)
        t_end = clock()
        if not (so.total_num_scheduled_tokens or so.preempted_req_ids or outputs.outputs or self.in_flight
                or self.has_work()):
            # Async's last step, scheduled while the final tokens were in flight, only carries bookkeeping;
            # vLLM's traces leave it out, and so do ours.
            return so, outputs
        if self.recorder is not None:
            self.recorder.on_step(self.num_steps, so, outputs, (step.t_schedule, step.t_execute, t_sample, t_update, t_end),
                                  step.cost)
        self.num_steps += 1
        self.num_preemptions += len(so.preempted_req_ids)
        return so, outputs

    def _fail(self, step: InFlightStep, error: Exception, t_sample: float) -> EngineCoreOutputs:
        """The forward or sampling raised: end exactly this step's requests with the error (their blocks
        freed, their advanced progress gone with them) so every other request keeps being served."""
        scheduler = self.scheduler
        so = step.so
        message = f"{type(error).__name__}: {error}"
        ids = [rid for rid in so.num_scheduled_tokens if rid in scheduler.requests]
        logger.error("step %d failed, ending its %d request(s): %s", self.num_steps, len(ids), message)
        for rid in ids:
            scheduler.requests[rid].error = message
        t_fail = self.clock()
        if self.recorder is not None:
            self.recorder.on_step(self.num_steps, so, EngineCoreOutputs([], scheduler.make_stats()),
                                  (step.t_schedule, step.t_execute, t_sample, t_fail, t_fail), step.cost)
        self.num_steps += 1
        self.num_preemptions += len(so.preempted_req_ids)
        freed = scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR)
        # The runner may have raised before dropping the requests that finished last step: tell it again.
        scheduler.finished_req_ids |= so.finished_req_ids
        if self.recorder is not None:
            self.recorder.on_abort(freed)
        outputs = [EngineCoreOutput(rid, [], "error", message, freed_block_ids=blocks) for rid, blocks in freed.items()]
        return EngineCoreOutputs(outputs, scheduler.make_stats())

    def count_decode_run(self, num_steps: int) -> None:
        """Steps a decode run (engine.core.decode_run) applied to the scheduler without this cycle count as
        its steps all the same; a rewind (`num_steps` < 0) takes back steps of the last run."""
        self.num_steps += num_steps

    def did_nothing(self, so: SchedulerOutput, outputs: EngineCoreOutputs) -> bool:
        """The step scheduled no token, preempted nobody and produced no output, and nobody runs: until
        a request arrives or ends from outside the next step would be the same (the simulators' stall)."""
        return not (so.total_num_scheduled_tokens or so.preempted_req_ids or outputs.outputs
                    or self.scheduler.running)

    def may_schedule_ahead(self, so: SchedulerOutput) -> bool:
        """vLLM's batch queue: after launching `so`, schedule the next step before finishing the oldest
        while the queue has room and `so` did something or more work waits."""
        return len(self.in_flight) < self.batch_queue_size and bool(so.total_num_scheduled_tokens or self.has_work())

    def step(self) -> EngineCoreOutputs:
        """One call of the engine core's loop: synchronous, or vLLM's step_with_batch_queue order
        (schedule the next step while one is in flight; finish the oldest once the queue is full or
        nothing more can be scheduled)."""
        if self.has_work():
            so = self.begin().so
            if self.may_schedule_ahead(so):
                return EngineCoreOutputs()
        elif not self.in_flight:
            return EngineCoreOutputs()
        return self.finish()[1]

