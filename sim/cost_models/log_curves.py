"""Interpolation between measured kernel times (AIConfigurator's tables, sim.cost_models.aiconfigurator):
log-log between points, flat below the first, a power of the axis above the last. The tables are sparse
grids and a simulation asks between and past their points millions of times, so a call is a bisect and
a power."""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LogCurve:
    """Times measured at increasing `xs`: linear in log-log between points, the first time below them,
    `ts[-1] * (x / xs[-1]) ** power` above them."""

    xs: tuple[float, ...]
    ts: tuple[float, ...]
    slopes: tuple[float, ...]  # slopes[i]: log-log slope from point i-1 to point i (slopes[0] unused)
    power: float

    @classmethod
    def of(cls, xs: list[float], ts: list[float], power: float = 1.0) -> LogCurve:
        if not xs or len(xs) != len(ts) or any(b <= a for a, b in zip(xs, xs[1:])) or min(ts) <= 0:
            raise ValueError("a curve needs increasing x and positive times")
        slopes = [0.0] + [math.log(ts[i] / ts[i - 1]) / math.log(xs[i] / xs[i - 1]) for i in range(1, len(xs))]
        return cls(tuple(map(float, xs)), tuple(map(float, ts)), tuple(slopes), power)

    def __call__(self, x: float) -> float:
        xs = self.xs
        i = bisect_right(xs, x)
        if i == 0:
            return self.ts[0]
        if i == len(xs):
            return self.ts[-1] if x == xs[-1] else self.ts[-1] * (x / xs[-1]) ** self.power
        x0 = xs[i - 1]
        return self.ts[i - 1] if x == x0 else self.ts[i - 1] * (x / x0) ** self.slopes[i]


@dataclass(frozen=True, slots=True)
class BatchGrid:
    """Decode attention over (batch, context): one context curve per measured batch (their context
    ranges differ: the tables stop where batch x context gets large), log-log between batches, in
    proportion to the batch above the largest."""

    batches: tuple[float, ...]
    curves: tuple[LogCurve, ...]

    def __call__(self, batch: float, kv: float) -> float:
        return self.at(batch, kv)[0]

    def at(self, batch: float, kv: float) -> tuple[float, bool]:
        """(seconds, outside): outside when past the largest batch or past the contexts measured in the
        batch rows it is read from."""
        bs = self.batches
        i = bisect_right(bs, batch)
        if i == 0:
            return self.curves[0](kv), True
        below = self.curves[i - 1]
        t0 = below(kv)
        outside = kv > below.xs[-1] or kv < below.xs[0]
        b0 = bs[i - 1]
        if batch == b0:
            return t0, outside
        if i == len(bs):
            return t0 * batch / b0, True
        above = self.curves[i]
        w = math.log(batch / b0) / math.log(bs[i] / b0)
        return t0 * (above(kv) / t0) ** w, outside or kv > above.xs[-1] or kv < above.xs[0]


@dataclass(frozen=True, slots=True)
class Streaming:
    """A kernel priced as `floor + tokens * per_token` (seconds): launch floor plus bytes over bandwidth."""

    floor: float
    per_token: float

    def __call__(self, x: float) -> float:
        return self.floor + x * self.per_token


def nearest(values: list[int], x: float) -> int:
    return min(values, key=lambda v: (abs(math.log(v / x)), -v))


def bracket(grid: list[int], x: float) -> tuple[list[tuple[int, float]], float]:
    """Grid points around x with their log-space weights, and the factor for x past the top of the grid."""
    if x <= grid[0]:
        return [(grid[0], 1.0)], 1.0
    if x >= grid[-1]:
        return [(grid[-1], 1.0)], x / grid[-1]
    i = bisect_right(grid, x)
    lo, hi = grid[i - 1], grid[i]
    if x == lo:
        return [(lo, 1.0)], 1.0
    w = math.log(x / lo) / math.log(hi / lo)
    return [(lo, 1.0 - w), (hi, w)], 1.0


def blend(curves: list[tuple[Any, float]], points: list[float], scale: float = 1.0) -> list[float]:
    """Weighted geometric mean of callables at `points`, times `scale`."""
    return [scale * math.exp(sum(w * math.log(c(x)) for c, w in curves)) for x in points]


def non_decreasing(ts: list[float]) -> list[float]:
    """Each time lowered to the least measured at or after it (times in increasing x): a point above a later
    one is a kernel's tile choice or a sampled routing's noise, and adding tokens must not make a step cheaper."""
    out = list(ts)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out
