"""Decode-only stretches of steps in closed form: k steps applied at once, as `Scheduler.schedule` and
`update_from_output` would apply them one by one.

Where `Scheduler.decode_only()` holds, each step gives every running request one token, calls
`allocate_slots` for a request only where the token passes its slot limit, admits nobody and appends
the sampled token. A `DecodeRun` applies k such steps whose tokens are known in advance (a simulator's):
`allocate_slots` at each crossing in the scheduler's order, tokens appended in bulk, counts set once. It
never takes a step that could differ: one that reaches a request's length limit, samples a token that may
stop it, or finds fewer free blocks than crossings (tests/test_decode_run.py holds it to the same steps
taken one by one).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.core.request import Request
from engine.core.scheduler import Scheduler


@dataclass(slots=True)
class RunTimes:
    """What the first `done` steps of a run took: their starts and ends, the three phases of each
    (schedule, execute, sample), and the blocks held after each."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    schedule: list[float] = field(default_factory=list)
    execute: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    done: int = 0

    def cut(self) -> None:
        """Drop the entries of a step interrupted halfway."""
        for values in (self.starts, self.ends, self.schedule, self.execute, self.sample, self.used):
            del values[self.done:]


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
        None: not one step. Call only where `scheduler.decode_only()`."""
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
        computed0, rids, slot_limit = self.computed0, self.rids, kv.slot_limit
        # A decode takes at most one new block: only a pool with fewer free blocks than crossings is checked.
        num_free = kv.block_pool.free_block_queue.num_free_blocks
        if len(due) > num_free and sum(kv.num_blocks_to_allocate(rids[i], computed0[i] + at + 1)
                                       for i in due) > num_free:
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
            if done:
                req.is_prefill_chunk = False


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
