"""One engine replica on the simulated clock, and its step policy, written once.

A replica is the engine's parts (`engine.core`'s scheduler with its KV cache manager and block pool, a
`StepCycle`, a `FakeModelRunner`) with a clock of its own. Its policy, `steps`, is a generator that reads
as the engine's loop: take in what has arrived, schedule and launch a step, wait for it to end, apply it.
Where it waits it yields the simulated time it waits for (None: until a request is routed to it), and
the cluster's event loop (sim.core.cluster) resumes it then; a step's end is applied by `finish_step`,
which the loop calls before it routes the arrivals of that instant, so a router reads the replica as it
is after the step.

The policy knows what a recorded replay and a calibrated profile know of the engine's loop: the recorded
start of each step (`step_start`), aborts and stop strings that came from outside the scheduler between
steps (`external`), and how an idle engine takes in a burst (`sim.cost_models.intake`).
"""
from __future__ import annotations

from collections import deque
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

from engine.core.async_scheduler import make_scheduler
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import EngineCoreOutputs
from engine.core.request import Request, RequestStatus
from engine.core.sched_output import SchedulerOutput
from engine.core.step_cycle import StepCycle, StepRecorder
from sim.core.decode_runs import MAX_RUN, DecodeRuns
from sim.core.headroom import Headroom
from sim.core.routers import ReplicaView
from sim.core.runner import FakeModelRunner
from sim.core.sources import SimRequest
from sim.core.stepping import launch
from sim.cost_models.base import CostModel
from sim.cost_models.intake import Intake
from traces.recorder import TraceRecorder

_FINISH_STATUS = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH_CAPPED}

# What the policy yields: the simulated time it waits for, or None to wait for a routed request.
Wait = float | None


class Loop(Protocol):
    """What a replica reads of the event loop that drives it (sim.core.cluster.Cluster), and tells it."""

    now: float  # the loop's clock: the time of the event being handled
    next_arrival: float | None  # the next arrival not yet routed
    num_added: int
    cost_model: CostModel

    def ended(self, req: Request) -> None: ...


class Engine(ReplicaView, Protocol):
    """What the event loop drives: one engine replica, or one data-parallel engine over several."""

    inbox: list[tuple[Request, SimRequest]]
    idle: bool
    stepping: bool
    policy: Generator[float | None, float, None]

    def finish_step(self) -> None: ...

    def rewind(self, t: float) -> None: ...

    def release(self) -> None: ...


class EngineLoop(ABC):
    """The engine core's loop, written once for every engine the cluster drives: one replica (one engine
    core) or a data-parallel engine stepping several in lockstep (sim.core.data_parallel). What differs
    between them is how a step is launched and what counts as work, the hooks below."""

    cluster: Loop
    now: float
    inbox: list[tuple[Request, SimRequest]]
    idle: bool
    stepping: bool
    step_start: Callable[[int], float | None] | None = None
    intake: Intake | None = None
    external: dict[int, list[tuple[str, str]]]

    @abstractmethod
    def _busy(self) -> bool:
        """Anything running or left to schedule, or outputs pending."""

    @abstractmethod
    def _in_flight(self) -> bool:
        """A launched step not yet finished."""

    @abstractmethod
    def _launch(self, step: int) -> tuple[float, bool]:
        """Schedule, price and launch step `step`: (its seconds, whether the batch queue takes another
        before this one finishes)."""

    @abstractmethod
    def _stalled(self) -> bool:
        """The step just finished did nothing, and nothing can run until a request arrives."""

    @abstractmethod
    def _decode_run(self, step: int) -> tuple[int, float]:
        """Steps a decode run took at once from `step` on, and when it ended ((0, now): none)."""

    @abstractmethod
    def _steps_finished(self) -> int:
        """Steps finished so far (what external finishes are keyed by)."""

    @abstractmethod
    def _take_inbox(self) -> None:
        """Add what was routed here, each at its own arrival up to the step's start."""

    @abstractmethod
    def _drain(self) -> list[tuple[Request, SimRequest]]: ...

    @abstractmethod
    def add(self, req: Request, sim_req: SimRequest) -> None: ...

    @abstractmethod
    def finish_external(self, items: list[tuple[str, str]]) -> None: ...

    # ---- the step policy ----
    def steps(self) -> Generator[Wait, float, None]:
        """The engine core's loop with a batch queue of the cycle's depth: 1 is synchronous scheduling, 2
        vLLM's async scheduling, where the next step is scheduled as soon as the one before it is
        launched (host time hidden behind device time), runs on the device when that one ends, and its
        outputs apply at its own end. A recorded replay launches each step no earlier than it was
        recorded (while there is something to take in or step); external finishes apply after the step
        they followed; decode-only stretches are taken as runs where the replica has them."""
        cluster = self.cluster
        step_start, intake, external = self.step_start, self.intake, self.external
        per_request = intake.per_request_s if intake is not None else 0.0
        ends: deque[float] = deque()  # when each step in flight leaves the device
        device_free = 0.0
        launched = 0  # steps launched, a run's included: the index a step is priced and recorded under
        woke, cold = False, 0.0
        while True:
            if external and (done := self._steps_finished()) in external:
                self.finish_external(external.pop(done))
            start = self.now
            if step_start is not None and (hinted := step_start(launched)) is not None and hinted > start:
                nxt = cluster.next_arrival
                if self._busy() or self.inbox or (nxt is not None and nxt <= hinted):
                    start = hinted
            if start > cluster.now:  # what arrives until then is added; what arrives while adding waits a step
                yield start
            if woke:  # each add after an idle wake-up delays the step (sim.cost_models.intake)
                for item in self._drain():
                    self.add(*item)
                    self.now += per_request
                start, woke = self.now, False
            else:
                self._take_inbox()  # each added at its own arrival, up to the step's start
            # The run's cold first add: what arrives meanwhile waits a step (sim.cost_models.intake).
            self.now, cold = (start if start > self.now else self.now) + cold, 0.0
            if self._busy():
                done, end = self._decode_run(launched)
                if done:
                    self.now = end
                    launched += done
                    continue
                length, ahead = self._launch(launched)
                device_free = (device_free if device_free > self.now else self.now) + length
                launched += 1
                ends.append(device_free)
                if ahead:
                    continue
            elif not self._in_flight():
                self.now = max(self.now, (yield from self._next_request()))
                if intake is not None:
                    look, cold = intake.wake()
                    self.now += look
                    woke = True
                continue
            end = ends.popleft()
            if end > self.now:
                self.now = end
            self.stepping = True
            yield self.now
            if self._stalled() and (step_start is None or step_start(launched) is None):
                # Nothing ran and nothing can until a request arrives here: wait for one.
                self.now = max(self.now, (yield from self._next_request()))

    def _next_request(self) -> Generator[Wait, float, float]:
        """When the next request routed here arrived: one already in the inbox, else wait for one."""
        if self.inbox:
            return self.inbox[0][1].add_time
        self.idle = True
        return (yield None)



class Replica(EngineLoop):
    """One engine replica: its scheduler, runner, inbox of routed requests and step policy."""

    def __init__(self, index: int, cluster: Loop, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, seed: int, vocab_size: int,
                 step_start: Callable[[int], float | None] | None = None, intake: Intake | None = None,
                 keep_requests: bool = True) -> None:
        self.index = index
        self.cluster = cluster
        self.now = 0.0
        self.scheduler = make_scheduler(scheduler_config, cache_config, clock=self.clock)
        self.runner = FakeModelRunner(seed, vocab_size, self.scheduler.requests)
        self.cycle = StepCycle(self.scheduler, self.runner, self.clock,
                               batch_queue_size=2 if scheduler_config.async_scheduling else 1)
        self.step_start = step_start
        self.intake = intake
        self.pool_map = self.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
        self.inbox: list[tuple[Request, SimRequest]] = []
        self.added: list[Request] | None = [] if keep_requests else None
        self.live: dict[str, Request] = {}
        self.external: dict[int, list[tuple[str, str]]] = {}
        self.recorder: TraceRecorder[Request] | None = None
        self.runs: DecodeRuns | None = None
        self.headroom: Headroom | None = None
        self.stepping = False  # the time it waits for ends a step: the cluster applies it with `finish_step`
        self.idle = False  # waiting for a routed request
        self.last: tuple[SchedulerOutput, EngineCoreOutputs] | None = None
        self.policy: Generator[Wait, float, None] = self.steps()

    def clock(self) -> float:
        return self.now

    def release(self) -> None:
        """Let go of everything this replica simulated, once its run has been read: the step policy is
        closed and the pool's links and every reference held here dropped, so the scheduler, its requests
        and blocks are freed at once (the scheduler's clock, this replica's method, made a cycle). The
        replica does nothing afterwards."""
        self.policy.close()
        self.scheduler.kv_cache_manager.block_pool.release()
        vars(self).clear()

    @property
    def num_steps(self) -> int:
        return self.cycle.num_steps

    def attach(self, recorder: TraceRecorder[Request], step_recorder: StepRecorder | None = None) -> None:
        """Record this replica's steps (through `step_recorder` where the loop numbers them, else
        straight), its decode runs included."""
        self.recorder = recorder
        self.cycle.recorder = step_recorder or recorder
        if self.runs is not None:
            self.take_runs()

    def take_runs(self) -> None:
        """Advance decode-only stretches as runs (sim.core.decode_runs), recorded where this replica records."""
        self.runs = DecodeRuns(self.scheduler, self.runner, self.cluster.cost_model, self.recorder)

    def rewind(self, t: float) -> None:
        """Take back the steps of the last decode run that end after `t` (a watch stopped the cluster)."""
        if self.runs is not None:
            self.cycle.count_decode_run(-self.runs.rewind(t))

    # ---- what a router reads ----
    @property
    def num_outstanding(self) -> int:
        s = self.scheduler
        return len(self.inbox) + len(s.running) + len(s.waiting)

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv_cache_manager.usage

    def cached_prefix_blocks(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt this replica's prefix cache holds."""
        table, n = self.pool_map, 0
        for h in block_hashes:
            if h not in table:
                break
            n += 1
        return n

    # ---- requests in and out ----
    def _take_inbox(self) -> None:
        """Add what was routed here, as the engine adds arrivals: the clock at each add is its arrival
        if that is later (the scheduler stamps `queued` with it)."""
        for req, sim_req in self._drain():
            if sim_req.add_time > self.now:
                self.now = sim_req.add_time
            self.add(req, sim_req)

    def add(self, req: Request, sim_req: SimRequest) -> None:
        self.runner.register(req.request_id, sim_req.output_token_ids)
        self.cycle.add_request(req)
        self.cluster.num_added += 1
        if self.added is not None:
            self.added.append(req)
        if req.is_finished():  # rejected: done, though never in finished_req_ids
            self.runner.forget(req.request_id)
            self.cluster.ended(req)
        else:
            self.live[req.request_id] = req

    def finish_external(self, items: list[tuple[str, str]]) -> None:
        """Aborts and stop strings recorded between steps: end them as the engine's frontend did."""
        by_status: dict[RequestStatus, list[str]] = {}
        for rid, reason in items:
            by_status.setdefault(_FINISH_STATUS.get(reason, RequestStatus.FINISHED_ABORTED), []).append(rid)
        for status, rids in by_status.items():
            freed = self.scheduler.finish_requests(rids, status)
            if self.recorder is not None:
                self.recorder.on_abort(freed)
            for rid in rids:
                self.runner.forget(rid)
                self.live.pop(rid, None)
                if self.headroom is not None:
                    self.headroom.ended(rid)

    def finish_step(self) -> None:
        """The step's end: apply its outputs, record it, and let the runner forget what ended."""
        self.stepping = False
        cluster = self.cluster
        self.last = self.cycle.finish()
        outputs = self.last[1]
        forget, live, headroom = self.runner.forget, self.live, self.headroom
        for out in outputs.outputs:
            if out.finish_reason is not None:
                forget(out.request_id)
                if headroom is not None:
                    headroom.ended(out.request_id)
                req = live.pop(out.request_id, None)  # a rejected request ended when added
                if req is not None:
                    cluster.ended(req)

    # ---- the step policy's view of this engine core (EngineLoop) ----
    def _busy(self) -> bool:
        return bool(self.scheduler.running) or self.cycle.has_work()

    def _in_flight(self) -> bool:
        return bool(self.cycle.in_flight)

    def _launch(self, step: int) -> tuple[float, bool]:
        so, timing = launch(self.cycle, self.cluster.cost_model, step)
        if self.headroom is not None:
            sched = self.scheduler
            self.headroom.scheduled(so, sched.requests, len(sched.running))
        return timing.total, self.cycle.may_schedule_ahead(so)

    def _stalled(self) -> bool:
        so, outputs = self._last_step()
        return self.cycle.did_nothing(so, outputs) and self.cycle.has_work()

    def _decode_run(self, step: int) -> tuple[int, float]:
        if self.runs is None or self.cycle.in_flight:
            return 0, self.now
        done, end = self.runs.advance(self.now, step, self.cluster.next_arrival, self._run_limit(step))
        self.cycle.count_decode_run(done)
        return done, end

    def _steps_finished(self) -> int:
        return self.cycle.num_steps

    def _last_step(self) -> tuple[SchedulerOutput, EngineCoreOutputs]:
        """The step `finish_step` applied, which the policy waited for."""
        if self.last is None:
            raise RuntimeError(f"replica {self.index}: resumed at a step's end before the step was applied")
        return self.last

    def _drain(self) -> list[tuple[Request, SimRequest]]:
        inbox, self.inbox = self.inbox, []
        return inbox

    def _run_limit(self, step: int) -> int:
        """A run stops before the next step that external finishes come before."""
        if not self.external:
            return MAX_RUN
        return min(MAX_RUN, min((s for s in self.external if s > step), default=step + MAX_RUN) - step)
