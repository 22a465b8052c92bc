"""Decode-only stretches of steps, applied to the scheduler without a SchedulerOutput per step.

Most steps of a long simulation change nothing but counts: every running request decodes one token,
nobody arrives, finishes or is preempted, and nobody waiting is admitted (none waits, or every seat is
taken). For such a step `Scheduler.schedule` gives each running request one token (and a block, or a block published, where it crosses its slot limit) and
`update_from_output` appends the token sampled. A `DecodeRun` applies a stretch of such steps whose tokens
are known in advance (a simulator's are): the KV cache manager's own `allocate_slots` at each crossing, in
the scheduler's order, tokens appended in bulk, counts set once. It never takes a step that could differ:
one that reaches a request's length limit, a token that may stop a request, a step short of free blocks
(tests/test_decode_run.py holds runs to the same steps taken one by one, under each scheduling policy).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.core.request import Request
from engine.core.scheduler import Scheduler


def ready_for_decode_run(scheduler: Scheduler) -> bool:
    """Every running request is a plain decode and nothing else waits to happen before the next step
    (synchronous scheduling only: async steps carry placeholders). Requests may wait where the decodes
    leave the scheduler no seat or token to admit them with: until a request finishes (which ends a run)
    each step looks no further. Finishes still to be announced do not count: the next schedule() only
    hands them on to the workers."""
    running = scheduler.running
    if (not running or scheduler.has_pending_outputs() or scheduler.has_placeholders
            or len(running) > scheduler.max_num_scheduled_tokens):
        return False
    if scheduler.waiting and scheduler.can_admit(scheduler.max_num_scheduled_tokens - len(running)):
        return False
    for req in running:
        if (req.num_computed_tokens != len(req.all_token_ids) - 1 or req.is_prefill_chunk
                or req.num_in_flight_tokens or not req.output_token_ids):
            return False
    return True


class DecodeRun:
    """Up to `steps` decode steps of the scheduler's running requests, with the tokens each samples in
    them. The caller visits the run's block crossings in step order (`next_crossing`, `cross`), then
    `end`s it after the steps it took; `gained` holds the blocks each crossing allocated. `num_waiting`
    and `admission_stop` are those of each of its steps."""

    __slots__ = ("scheduler", "running", "rids", "computed0", "tokens", "steps", "crossings", "applied",
                 "gained", "done", "num_waiting", "admission_stop")

    def __init__(self, scheduler: Scheduler, tokens: list[list[int]], steps: int) -> None:
        self.scheduler = scheduler
        self.running = list(scheduler.running)
        self.num_waiting = len(scheduler.waiting)
        self.admission_stop = (scheduler.closed_admission(scheduler.max_num_scheduled_tokens - len(self.running))
                               if self.num_waiting else None)
        self.rids = [r.request_id for r in self.running]
        self.computed0 = [r.num_computed_tokens for r in self.running]
        self.tokens = tokens
        self.steps = steps
        slot_limit = scheduler.kv_cache_manager.slot_limit
        self.crossings: dict[int, list[int]] = {}  # step in the run -> running indices that call allocate_slots
        for i, (rid, c) in enumerate(zip(self.rids, self.computed0)):
            j = slot_limit[rid] - c
            if j < steps:
                self.crossings.setdefault(j, []).append(i)
        self.applied = [0] * len(self.running)  # per request, tokens of the run appended so far
        self.gained: dict[int, list[int]] = {}  # j * n + i -> the blocks request i gained in step j
        self.done = 0

    @classmethod
    def plan(cls, scheduler: Scheduler, max_steps: int,
             upcoming: Callable[[list[Request], int], list[list[int]]]) -> DecodeRun | None:
        """The run from here: at most `max_steps`, none that reaches a request's length limit (that step
        finishes it) or samples a token that may stop it (check_stop decides: that step is the loop's).
        `upcoming(requests, count)` gives the tokens each samples at its next `count` output positions.
        None: not one step."""
        steps = max_steps
        running = scheduler.running
        for req in running:
            left = req.num_tokens_limit - len(req.all_token_ids) - 1
            if left < steps:
                steps = left
        if steps <= 0:
            return None
        tokens = upcoming(running, steps)
        for req, toks in zip(running, tokens):
            stop = req.stop_token_set
            if stop:
                for j, t in enumerate(toks):
                    if t in stop:
                        steps = j
                        break
        return cls(scheduler, tokens, steps) if steps > 0 else None

    def next_crossing(self) -> int | None:
        """The next step of the run at which some request calls allocate_slots."""
        return min(self.crossings) if self.crossings else None

    def cross(self, at: int) -> bool:
        """Step `at`'s crossings, in the scheduler's order, each request caught up to that step first;
        False, with nothing done, where the pool is short (the scheduler would preempt there)."""
        due = self.crossings.pop(at)
        due.sort()
        kv = self.scheduler.kv_cache_manager
        computed0, rids = self.computed0, self.rids
        req_blocks, block_size, slot_limit = kv.req_to_blocks, kv.block_size, kv.slot_limit
        num_free = kv.block_pool.free_block_queue.num_free_blocks
        # A decode needs at most one new block: only a pool with fewer free blocks than crossings is checked.
        if len(due) > num_free and sum(1 for i in due if computed0[i] + at + 1
                                       > len(req_blocks[rids[i]]) * block_size) > num_free:
            self.crossings[at] = due
            return False
        n = len(rids)
        for i in due:
            req = self.running[i]
            _catch_up(req, self.tokens[i], self.applied[i], at)
            self.applied[i] = at
            req.num_computed_tokens = computed0[i] + at
            new_blocks = kv.allocate_slots(req, 1)
            if new_blocks:
                self.gained[at * n + i] = [b.block_id for b in new_blocks]
            j = slot_limit[rids[i]] - computed0[i]
            if j < self.steps:
                self.crossings.setdefault(j, []).append(i)
        return True

    def end(self, done: int) -> None:
        """Close the run after its first `done` steps: each request holds their tokens and counts, and
        finishes left to announce were announced by the first of them, as schedule() does."""
        self.done = done
        if done and self.scheduler.finished_req_ids:
            self.scheduler.finished_req_ids = set()
        for i, req in enumerate(self.running):
            _catch_up(req, self.tokens[i], self.applied[i], done)
            req.num_computed_tokens = self.computed0[i] + done


def rewind_decode_steps(requests: Iterable[Request], k: int) -> None:
    """Take back the last `k` decode steps of `requests`: their tokens, counts and block hashes. The
    blocks those steps allocated stay held (a caller rewinds to read results, and steps no further)."""
    for req in requests:
        del req.output_token_ids[-k:]
        del req.all_token_ids[-k:]
        req.num_computed_tokens -= k
        if req.block_size:
            del req.block_hashes[len(req.all_token_ids) // req.block_size:]


def _catch_up(req: Request, tokens: list[int], applied: int, upto: int) -> None:
    """Append the run's tokens of steps applied .. upto - 1, as update_from_output would have."""
    if upto <= applied:
        return
    new = tokens[applied:upto]
    req.output_token_ids.extend(new)
    all_ids = req.all_token_ids
    all_ids.extend(new)
    # Hashed only once a block has filled: half the calls come at a crossing that allocates a block,
    # one step after the crossing that filled (and published) the last one.
    if req.block_size and len(all_ids) // req.block_size > len(req.block_hashes):
        req.update_block_hashes()
