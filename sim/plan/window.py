"""What the planner measures a rate by: a deployment's steady state, not the burst it absorbs. The offered
stream at a rate is the workload's own requests, looped for as long as a warm-up, a measurement window and
a tail need (each copy's token ids shifted, so copies share no prefix cache); the SLOs are judged over the
window's requests only, and the rate holds only if the deployment keeps up over the window (the requests
it takes into service there come to `min_served_ratio` x those offered there: its queue stops growing)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.sources import SimRequest

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_WINDOW = 400
# The most requests a warm-up (or a tail) takes: the rates a search doubles up to would otherwise ask for
# millions of requests; a deployment that needs more than this to fill at such a rate has long failed.
MAX_EDGE = 4000
TOKEN_SHIFT = 7919  # a copy's token ids move by a prime multiple of this, modulo the vocabulary


@dataclass(frozen=True, slots=True)
class Window:
    """Offered requests in order: `warmup` fill the queues from empty, the next `requests` are measured,
    and `tail` more keep the load on while the measured ones finish."""

    base: int  # the workload's requests
    requests: int
    warmup: int
    tail: int

    @classmethod
    def for_rate(cls, base: int, rate: float, requests: int = DEFAULT_WINDOW, lifetime_s: float = 0.0) -> Window:
        """`lifetime_s`: how long a request of the workload runs on the plan's slowest configuration at full
        load. The warm-up, the window and the tail each last at least two lifetimes at `rate`: a window
        shorter than a request's life would measure a deployment still filling up (and let a larger one
        absorb a burst it cannot sustain)."""
        edge = min(max(requests // 4, math.ceil(2 * lifetime_s * rate), 1), max(MAX_EDGE, requests))
        return cls(base=base, requests=max(requests, edge), warmup=edge, tail=edge)

    @property
    def total(self) -> int:
        return self.warmup + self.requests + self.tail

    @property
    def loops(self) -> int:
        return math.ceil(self.total / self.base)

    def describe(self) -> str:
        how = (f"the workload's {self.base} requests looped {self.loops}x (each copy's tokens shifted: no cache "
               "shared between copies)" if self.loops > 1 else f"the workload's first {self.total} requests")
        return (f"measured over requests {self.warmup + 1}-{self.warmup + self.requests} of {self.total} offered "
                f"after a warm-up of {self.warmup}, {how}")


def _shifted(ids: list[int] | None, copy: int, vocab_size: int) -> list[int] | None:
    if ids is None or copy == 0:
        return ids
    return ((np.asarray(ids, dtype=np.int64) + copy * TOKEN_SHIFT) % vocab_size).tolist()


_OFFERED: dict[tuple[int, Window, int], tuple[tuple[SimRequest, ...], tuple[SimRequest, ...]]] = {}
_KEPT = 2


def offered_requests(base: tuple[SimRequest, ...], window: Window, vocab_size: int) -> tuple[SimRequest, ...]:
    """`window.total` requests at the workload's own rate: the workload, then copies of it, each copy
    starting one mean gap after the previous one ends, so the rate and the arrival pattern carry on. Made
    once per base stream (kept by identity, as base_requests keeps the base) and window."""
    key = (id(base), window, vocab_size)
    if key not in _OFFERED:
        while len(_OFFERED) >= _KEPT:
            del _OFFERED[next(iter(_OFFERED))]
        _OFFERED[key] = (base, _looped(base, window, vocab_size))
    return _OFFERED[key][1]


def _looped(base: tuple[SimRequest, ...], window: Window, vocab_size: int) -> tuple[SimRequest, ...]:
    span = base[-1].arrival - base[0].arrival
    period = span * len(base) / (len(base) - 1)
    out: list[SimRequest] = []
    for i in range(window.total):
        copy, index = divmod(i, len(base))
        r = base[index]
        if copy == 0:
            out.append(r)
            continue
        shift = copy * period
        out.append(SimRequest(request_id=f"{r.request_id}~{copy}", arrival=r.arrival + shift,
                              prompt_token_ids=_shifted(r.prompt_token_ids, copy, vocab_size), max_tokens=r.max_tokens,
                              add_time=r.add_time + shift, num_prompt_tokens=r.num_prompt_tokens,
                              prompt_block_hashes={}))
    return tuple(out)


def window_ids(offered: tuple[SimRequest, ...], window: Window) -> frozenset[str]:
    return frozenset(r.request_id for r in offered[window.warmup:window.warmup + window.requests])


def window_span(offered: tuple[SimRequest, ...], window: Window, scale: float) -> tuple[float, float]:
    """First and last arrival of the window's requests at time scale `scale`."""
    return offered[window.warmup].arrival * scale, offered[window.warmup + window.requests - 1].arrival * scale


def served_over_window(requests: pd.DataFrame, window: Window, span: tuple[float, float]) -> dict[str, Any]:
    """Offered and served rate over the window's arrivals (first to last): served counts every request
    taken into service (first scheduled) in that span, wherever it arrived. A deployment that keeps up
    serves what it is offered; one that does not leaves a queue that grows. Finishes would lag arrivals by
    a whole request's latency, which says nothing of the queue."""
    t0, t1 = span
    started = requests["first_scheduled"].to_numpy(dtype=float)
    served = int(((started >= t0) & (started <= t1)).sum())
    offered = (window.requests - 1) / (t1 - t0)
    served_rate = served / (t1 - t0)
    return {"offered_rate": offered, "served_rate": served_rate, "served_ratio": served_rate / offered,
            "window_s": t1 - t0}
