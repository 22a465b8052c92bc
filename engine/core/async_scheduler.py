"""vLLM 0.32's AsyncScheduler: step k+1 is scheduled before step k's sampled tokens are known.

The engine core keeps a batch queue of two, so each request that will sample in a step gets an output
placeholder when it is scheduled; the next step schedules the token after it without knowing its value.
A placeholder turns into a real token when the step's output is applied, so stop checks and finishes
land one step later than in synchronous scheduling, and blocks are published to the prefix cache only
up to the tokens actually known.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    has_placeholders = True

    def _settle_placeholders(self, req: Request, num_new: int, stale: bool, status_before: RequestStatus) -> None:
        if not stale:  # a preemption already dropped the placeholders of steps in flight
            req.num_output_placeholders -= num_new
        if status_before == RequestStatus.RUNNING:
            self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens - req.num_output_placeholders)


def make_scheduler(scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                   clock: Callable[[], float] = time.monotonic) -> Scheduler:
    """The scheduler class `scheduler_config.async_scheduling` asks for."""
    cls = AsyncScheduler if scheduler_config.async_scheduling else Scheduler
    return cls(scheduler_config, cache_config, clock)
