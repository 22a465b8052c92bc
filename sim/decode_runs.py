"""Runs of decode-only steps, advanced without a SchedulerOutput per step.

Most steps of a long replay change nothing but counts: every running request decodes one token, and
nobody waits, arrives, finishes or is preempted. For such a step `Scheduler.schedule` gives each running
request one token (and a block, or a block published, where it crosses its `slot_limit`) and
`update_from_output` appends the sampled token. `DecodeRuns.advance` does exactly that for a run of
steps: the KV cache manager's own `allocate_slots` at each crossing, in the scheduler's order, tokens
appended in bulk, and the whole run recorded at once (`TraceRecorder.on_decode_run`: its decision rows
as one entry of the writer's row runs, `traces.runs`). A run stops before any
step that could differ: an arrival, a token that may stop a request, a step short of free blocks. So
block ids, hashes, times and every trace table equal the step-by-step loop's
(tests/test_decode_runs.py replays workloads both ways and compares them).
"""
from __future__ import annotations

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from sim.batch import StepBatch
from sim.cost_models.base import CostModel
from sim.runner import FakeModelRunner
from traces.recorder import TraceRecorder

# Steps looked ahead per run: tokens are drawn for this many steps before the run can tell where it ends.
MAX_RUN = 64


class DecodeRuns:
    """Advances the synchronous simulator through decode-only runs; `advance` returns the steps taken."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner, recorder: TraceRecorder,
                 cost_model: CostModel) -> None:
        self.scheduler = scheduler
        self.kv = scheduler.kv_cache_manager
        self.runner = runner
        self.recorder = recorder
        self.cost_model = cost_model
        self.num_steps = 0  # steps taken in runs, of the whole replay
        self._last_step = 0.0  # seconds of the last step of the last run

    def ready(self) -> bool:
        """Every running request is a plain decode and nothing else waits to happen before the next step."""
        s = self.scheduler
        running = s.running
        if (not running or s.waiting or s.finished_req_ids or s.has_pending_outputs() or s.has_placeholders
                or len(running) > s.max_num_scheduled_tokens or not self.recorder.is_between_steps()):
            return False
        for req in running:
            if (req.num_computed_tokens != len(req.all_token_ids) - 1 or req.is_prefill_chunk
                    or req.num_in_flight_tokens or not req.output_token_ids):
                return False
        return True

    def advance(self, now: float, step: int, next_arrival: float | None, max_steps: int = MAX_RUN) -> tuple[int, float]:
        """Run decode steps from `now` (step index `step`) while no arrival is due at a step's start;
        returns (steps taken, the clock after the last). Call only when `ready()`."""
        running = list(self.scheduler.running)
        n = len(running)
        rids = [r.request_id for r in running]
        computed0 = [r.num_computed_tokens for r in running]
        steps = max_steps
        if next_arrival is not None and self._last_step > 0:
            # Tokens are drawn for the steps up to about the next arrival, not all max_steps of them: a
            # shorter guess costs one more call, drawing past the arrival is wasted work.
            steps = min(steps, int((next_arrival - now) / self._last_step) + 2)
        for req in running:  # the step that reaches max_tokens (or max_model_len) finishes: not in a run
            left = req.num_tokens_limit - len(req.all_token_ids) - 1
            if left < steps:
                steps = left
        if steps <= 0:
            return 0, now
        upcoming = self.runner.upcoming
        tokens = []
        for req in running:
            toks = upcoming(req.request_id, len(req.output_token_ids), steps)
            stop = req.stop_token_set
            if stop:
                for j, t in enumerate(toks):
                    if t in stop:  # may stop it (check_stop decides): that step is the loop's
                        steps = j
                        break
            tokens.append(toks)
        if steps <= 0:
            return 0, now
        kv, block_size = self.kv, self.kv.block_size
        slot_limit, req_blocks = kv.slot_limit, kv.req_to_blocks
        crossings: dict[int, list[int]] = {}  # step in the run -> running indices that call allocate_slots
        for i, (rid, c) in enumerate(zip(rids, computed0)):
            j = slot_limit[rid] - c
            if j < steps:
                crossings.setdefault(j, []).append(i)
        applied = [0] * n  # per request, tokens of the run appended so far
        free_blocks = kv.block_pool.free_block_queue
        num_usable = kv.block_pool.num_usable_blocks
        cost, recorder = self.cost_model, self.recorder
        step_time, split = cost.step_time, hasattr(cost, "last_phases")
        context0 = n + sum(computed0)
        starts: list[float] = []
        ends: list[float] = []
        phases: list[tuple[float, float, float]] = []
        used: list[int] = []
        gained: dict[int, list[int]] = {}  # j * n + i -> the blocks request i gained in step j
        done = 0
        try:
            while done < steps:
                if next_arrival is not None and next_arrival <= now:
                    break
                due = crossings.pop(done, None)
                if due is not None:
                    due.sort()
                    need = sum(1 for i in due if computed0[i] + done + 1 > len(req_blocks[rids[i]]) * block_size)
                    if need > free_blocks.num_free_blocks:
                        break  # the scheduler would preempt here
                    for i in due:
                        req = running[i]
                        _catch_up(req, tokens[i], applied[i], done)
                        applied[i] = done
                        req.num_computed_tokens = computed0[i] + done
                        new_blocks = kv.allocate_slots(req, 1)
                        if new_blocks:
                            gained[done * n + i] = [b.block_id for b in new_blocks]
                        j = slot_limit[rids[i]] - computed0[i]
                        if j < steps:
                            crossings.setdefault(j, []).append(i)
                    recorder.on_decode_step_blocks(step + done)
                elif (step + done) % recorder.snapshot_every == 0:
                    recorder.on_decode_step_blocks(step + done)
                start = now
                now = start + step_time(StepBatch(0, n, 0, n, context0 + n * done, 0.0), step + done)
                starts.append(start)
                ends.append(now)
                # A cost model that splits its step (model time, host time) as CycleRecorder reads it.
                phases.append(cost.last_phases if split else (0.0, now - start, 0.0))
                used.append(num_usable - free_blocks.num_free_blocks)
                done += 1
            if done:
                self._last_step = ends[-1] - starts[-1]
        finally:
            self.num_steps += done
            for i, req in enumerate(running):
                _catch_up(req, tokens[i], applied[i], done)
                req.num_computed_tokens = computed0[i] + done
            recorder.on_decode_run(rids, computed0, starts, ends, phases, used, gained)
        return done, now


def _catch_up(req: Request, tokens: list[int], applied: int, upto: int) -> None:
    """Append the run's tokens of steps applied .. upto - 1, as update_from_output would have."""
    if upto <= applied:
        return
    new = tokens[applied:upto]
    req.output_token_ids.extend(new)
    req.all_token_ids.extend(new)
    if req.block_size:
        req.update_block_hashes()
