"""How measured steps scatter around the fitted laws, kept whole and replayed by a seeded block bootstrap.

On a shared machine a step is slow mostly because something else holds the CPU for a while: slow steps
come in runs (the log-ratio's autocorrelation stays high for tens of steps), and no batch-shape term
explains them. So no step is dropped: every step's ratio measured / law (device, host and gap together,
so their correlation survives) is stored in step order, and a sampled replay draws contiguous blocks of
those ratios. Blocks keep the runs of slow steps that move TTFT and TPOT tails; independent draws would
average them away and give intervals that are far too narrow.

A slow spell lasts seconds of wall time, not a number of steps, so the table also keeps each step's start
and a replay that knows its clock draws blocks of time: a simulated step at time t takes the ratios of
the calibration step under way at a random offset + t. Drawn by step index, a spell covers as many steps
as it held in the calibration run: few, since its steps were slow, and no more when the replayed steps
are longer. On the fidelity bench's shared 2-core machine (calibration runs of mostly 4 ms decode steps)
the device ratios averaged 1.0 per step but 1.2-1.7 per second of the calibration run, and bursty
held-out runs measured 1.4-1.6 times the law: a step-indexed replay of them came out too fast.
Drawn by time, the model's part of a step is not one ratio times the law but the law's work done at the
calibration run's speed (1 / ratio of the calibration step under way at each instant): a freeze is a
freeze, whatever ran through it. One calibration step froze for 7.6 s (ratio 827 on a 9 ms law); scaled
by its ratio a 300 ms prefill starting in it would take 248 s; worked through, the rest of the freeze.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.cost_models.parts import PARTS

MAX_BLOCK = 64
GRID_S = 0.05  # the time grid the autocorrelation in time is measured on
MAX_BLOCK_S = 10.0


def block_length(log_ratio: np.ndarray, max_block: int = MAX_BLOCK) -> int:
    """Twice the first lag at which the autocorrelation of the device log-ratio falls below 1/e,
    within [1, max_block]: long enough to keep a slow spell in one block."""
    x = log_ratio - log_ratio.mean()
    var = float(x @ x)
    if len(x) < 4 or var <= 0:
        return 1
    for lag in range(1, min(max_block, len(x) // 2)):
        if float(x[:-lag] @ x[lag:]) / var < 1 / np.e:
            return max(1, min(max_block, 2 * lag))
    return min(max_block, max(1, len(x) // 4))


def covering(starts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the step under way at each time in `t` (the last start at or before it; `starts`
    sorted): an idle stretch keeps the state its last step measured."""
    return np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)


def block_seconds(log_ratio: np.ndarray, starts: list[np.ndarray]) -> float:
    """block_length of the device log-ratio seen on a GRID_S time grid (each trace on its own), in s."""
    series, lo = [], 0
    for st in starts:
        grid = np.arange(st[0], st[-1], GRID_S) if len(st) > 1 else st[:1]
        series.append(log_ratio[lo:lo + len(st)][covering(st, grid)])
        lo += len(st)
    return GRID_S * block_length(np.concatenate(series), int(MAX_BLOCK_S / GRID_S))


def residual_table(ratios: np.ndarray, segments: list[int], starts: np.ndarray | None = None) -> dict[str, Any]:
    """The profile's `residuals` entry: ratios (rows: steps in order; columns: PARTS), the block length
    in steps and, given the steps' `starts` (seconds on each trace's clock), in seconds."""
    dev = np.log(np.maximum(ratios[:, 0], 1e-6))
    out = {"parts": list(PARTS), "block_steps": block_length(dev), "segments": [int(s) for s in segments],
           "ratios": [[round(float(v), 5) for v in row] for row in ratios]}
    if starts is not None:
        bounds = np.cumsum([0, *segments])
        per_trace = [np.asarray(starts[lo:hi], dtype=float) for lo, hi in zip(bounds[:-1], bounds[1:])]
        out["block_seconds"] = block_seconds(dev, per_trace)
        out["starts"] = [round(float(v), 6) for v in starts]
    return out


class ResidualSampler:
    """Step i's multipliers (device, host, gap) for one seeded replay: blocks of consecutive measured
    ratios, each block from a random start inside one calibration trace; or, with `at_time`, blocks of
    block_seconds of the calibration traces' clock (tables that carry the steps' starts)."""

    def __init__(self, table: dict[str, Any], seed: int) -> None:
        self.ratios = np.asarray(table["ratios"], dtype=float).reshape(-1, len(PARTS))
        self.block = max(1, int(table.get("block_steps", 1)))
        bounds = np.cumsum([0, *table.get("segments", [len(self.ratios)])])
        # Valid block starts: a block never runs across the end of a trace.
        self.starts = np.concatenate([np.arange(lo, max(lo + 1, hi - self.block + 1))
                                      for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])
        self.rng = np.random.default_rng(seed)
        self.drawn: list[np.ndarray] = []
        self.block_s = float(table.get("block_seconds") or 0.0)
        starts = table.get("starts")
        self.timed = bool(starts) and self.block_s > 0
        if self.timed:
            st = np.asarray(starts, dtype=float)
            self.traces = [(lo, st[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
            spans = np.array([max(s[-1] - s[0] - self.block_s, 0.0) + 1e-9 for _, s in self.traces])
            self.trace_p = spans / spans.sum()  # every second of calibration equally likely
        self.time_blocks: list[tuple[int, float]] = []

    def _position(self, t: float) -> tuple[int, float]:
        """The calibration trace and the time on its clock that simulated time `t` falls on."""
        j = int(max(t, 0.0) // self.block_s)
        while len(self.time_blocks) <= j:
            k = int(self.rng.choice(len(self.traces), p=self.trace_p))
            st = self.traces[k][1]
            self.time_blocks.append((k, st[0] + self.rng.uniform(0, max(st[-1] - st[0] - self.block_s, 0.0))))
        k, offset = self.time_blocks[j]
        return k, offset + max(t, 0.0) - j * self.block_s

    def at_time(self, t: float) -> np.ndarray:
        """The multipliers for a step starting at simulated time `t` (seconds from the replay's start)."""
        k, pos = self._position(t)
        lo, st = self.traces[k]
        return self.ratios[lo + int(covering(st, np.array([pos]))[0])]

    def device_seconds(self, t: float, work: float) -> float:
        """How long `work` seconds of law take from simulated time `t`, each instant at the speed of the
        calibration step under way then (the last one's speed past the end of its trace)."""
        k, pos = self._position(t)
        lo, st = self.traces[k]
        i = int(covering(st, np.array([pos]))[0])
        elapsed = 0.0
        while work > 0:
            ratio = max(float(self.ratios[lo + i, 0]), 1e-6)
            room = (st[i + 1] - pos) if i + 1 < len(st) else np.inf
            if work * ratio <= room:
                return elapsed + work * ratio
            elapsed, work, pos, i = elapsed + room, work - room / ratio, st[i + 1], i + 1
        return elapsed

    def at(self, step: int) -> np.ndarray:
        while len(self.drawn) <= step:
            s = int(self.starts[self.rng.integers(len(self.starts))])
            self.drawn.extend(self.ratios[s:s + self.block])
        return self.drawn[step]


class ResidualScaled:
    """Any cost model's step times scaled by sampled device ratios of a calibration profile: the scatter
    a real machine showed, laid over a model (e.g. the roofline) that has none of its own."""

    def __init__(self, base: Any, table: dict[str, Any], seed: int) -> None:
        self.base = base
        self.sampler = ResidualSampler(table, seed)
        self.seed = seed
        self.name = f"{base.name}+residuals"

    def step_time(self, batch: Any, step: int) -> float:
        return self.base.step_time(batch, step) * float(self.sampler.at(step)[0])

    def describe(self) -> dict:
        return {**self.base.describe(), "residual_seed": self.seed}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)
