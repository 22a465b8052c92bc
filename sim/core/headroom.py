"""How close a run came to the limits its decisions could depend on.

The scheduler reads `max_num_seqs` only when it admits a waiting request (`len(running) < max_num_seqs`),
and the KV cache's block size only through the pool: how many blocks a request needs, whether the pool
is short, which full blocks are prefix hits. A run whose running requests never reached a cap makes the
same decisions under any other cap they would not reach either; a run whose running requests could
never, even grown to their token limits, fill the pool at a block size is never short of blocks there.
`Headroom` measures both as a replica runs: the peak number of running requests, and the peak of the
blocks its running requests could hold at their token limits, at each block size asked about.
`sim.plan.reuse` turns that into the proof that a configuration's simulation equals one already run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.request import Request
from engine.core.sched_output import SchedulerOutput


@dataclass(slots=True, kw_only=True)
class HeadroomReport:
    """The peaks of one run or several (`merge`: every run's peaks together); `preempted`: some run
    preempted a request, so the pool did bind there."""

    peak_running: int = 0
    peak_blocks: dict[int, int] = field(default_factory=dict)
    preempted: bool = False

    def merge(self, other: HeadroomReport) -> None:
        self.peak_running = max(self.peak_running, other.peak_running)
        for size, peak in other.peak_blocks.items():
            self.peak_blocks[size] = max(self.peak_blocks.get(size, 0), peak)
        self.preempted |= other.preempted


class Headroom:
    """One replica's peaks; `scheduled` after each schedule, `ended` when a request ends."""

    def __init__(self, block_sizes: tuple[int, ...]) -> None:
        self.block_sizes = block_sizes
        self.report = HeadroomReport(peak_blocks={b: 0 for b in block_sizes})
        self._held = [0] * len(block_sizes)
        self._holding: dict[str, list[int]] = {}

    def scheduled(self, so: SchedulerOutput, requests: dict[str, Request], num_running: int) -> None:
        report = self.report
        if num_running > report.peak_running:
            report.peak_running = num_running
        if so.preempted_req_ids:
            report.preempted = True
        if not so.scheduled_new_reqs:
            return
        held = self._held
        for new in so.scheduled_new_reqs:
            limit = requests[new.req_id].num_tokens_limit
            blocks = [-(-limit // b) for b in self.block_sizes]
            self._holding[new.req_id] = blocks
            for i, n in enumerate(blocks):
                held[i] += n
        peaks = report.peak_blocks
        for b, n in zip(self.block_sizes, held):
            if n > peaks[b]:
                peaks[b] = n

    def ended(self, request_id: str) -> None:
        blocks = self._holding.pop(request_id, None)
        if blocks is not None:
            for i, n in enumerate(blocks):
                self._held[i] -= n
