"""Stopping a run as soon as its verdict is known: a search probes many rates that clearly fail, and a
watched run ends at the first point where no later request could make its SLOs hold (or, given a
measurement window, once every request of the window has ended)."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from traces.metrics import FINISHED, SLO, latency

if TYPE_CHECKING:
    from engine.core.request import Request


def _latency(req: Request, metric: str) -> float:
    """One request's latency by traces.metrics' definition; inf for a request that did not finish."""
    if req.status.finish_reason not in FINISHED:
        return math.inf
    return float(latency(metric, req.arrival_time, req.first_scheduled_time, req.first_token_time,
                         req.finished_time, req.num_output_tokens))


# Latencies a request still in flight is already known to miss once it has waited past the threshold
# without reaching the latency's end: its first token, its first schedule, its finish.
_STILL_OPEN: dict[str, Callable[[Request], float | None]] = {
    "ttft": lambda r: r.first_token_time, "queue": lambda r: r.first_scheduled_time, "e2e": lambda r: r.finished_time}


class MissWatch:
    """Stops a run (see `Cluster.run`) once some SLO's percentile is over its threshold whatever the other
    requests do: with m misses among N values, numpy's (linear) percentile p exceeds the threshold when
    m >= N - floor((N-1)p/100). A miss counts when a request ends over the threshold, or earlier, while it
    is still in flight, once it has waited past a TTFT, queue or e2e threshold: an overloaded cluster's
    verdict is then known while its queue is still growing, long before those requests finish."""

    def __init__(self, slos: list[SLO], num_requests: int, window: frozenset[str] | None = None) -> None:
        """`window`: only these requests count (`num_requests` of them), and the run stops once they all ended."""
        self.slos = slos
        self.window = window
        self.left = num_requests
        self.limits = [num_requests - math.floor((num_requests - 1) * (s.percentile or 100) / 100) for s in slos]
        self.missed: list[set[str]] = [set() for _ in slos]
        open_thresholds = [s.threshold_s for s in slos if s.metric in _STILL_OPEN]
        # Asked about requests in flight every half of the shortest such threshold of simulated time.
        self.interval = min(open_thresholds) / 2 if open_thresholds else None

    def _miss(self, i: int, request_id: str) -> bool:
        missed = self.missed[i]
        missed.add(request_id)
        return len(missed) >= self.limits[i]

    def ended(self, req: Request) -> bool:
        """A request finished or was rejected; True once the verdict is a miss, or the window is over."""
        if self.window is not None and req.request_id not in self.window:
            return False
        lost = False
        for i, slo in enumerate(self.slos):
            if _latency(req, slo.metric) > slo.threshold_s:
                lost |= self._miss(i, req.request_id)
        self.left -= 1
        return lost or (self.window is not None and self.left == 0)

    def in_flight(self, now: float, requests: Iterable[Request]) -> bool:
        """The requests still in flight at `now`; True once the verdict is a miss."""
        lost = False
        for req in requests:
            if self.window is not None and req.request_id not in self.window:
                continue
            waited = now - req.arrival_time
            for i, slo in enumerate(self.slos):
                reached = _STILL_OPEN.get(slo.metric)
                if reached is not None and waited > slo.threshold_s and reached(req) is None:
                    lost |= self._miss(i, req.request_id)
        return lost
