"""How measured steps scatter around the fitted laws, kept whole and replayed by a seeded block bootstrap.

On a shared machine a step is slow mostly because something else holds the CPU for a while, so slow steps
come in runs that no batch-shape term explains. No step is dropped: every step's ratio measured / law
(device, host and gap together, so their correlation survives) is stored in step order, and a sampled
replay draws contiguous blocks of them; blocks keep the runs of slow steps that move TTFT and TPOT tails,
which independent draws would average away into intervals far too narrow.

The machine's speed also differs from run to run, by more than a replay of one run averages out. So a
sampled replay is one run: it runs at one level (`predictive_level`, a new run's level predicted from
the calibration runs' parts) and draws blocks of within-run scatter (each run's ratios over its own
level) from all of them. Wider intervals drawn this way hold out better (bench/fidelity.py).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.cost_models.base import CostModel, CostModelDefaults, CostModelInfo, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cost_models.intake import Intake
from sim.cost_models.parts import PARTS
from sim.cost_models.profile import ResidualTable

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


def residual_table(ratios: np.ndarray, segments: list[int]) -> ResidualTable:
    """The profile's `residuals` entry: ratios (rows: steps in order; columns: PARTS) and the block length."""
    dev = np.log(np.maximum(ratios[:, 0], 1e-6))
    return ResidualTable(parts=list(PARTS), block_steps=block_length(dev), segments=[int(s) for s in segments],
                         ratios=[[round(float(v), 5) for v in row] for row in ratios])


def run_levels(ratios: np.ndarray, segments: list[int]) -> np.ndarray:
    """Each calibration run's mean ratio per part (rows: runs with steps): how fast the machine ran it."""
    bounds = np.cumsum([0, *segments])
    return np.array([ratios[lo:hi].mean(axis=0) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])


PSEUDO_RUNS = 4
MIN_PSEUDO_RUN_STEPS = 100


def levels_from(segments: list[int]) -> list[int]:
    """The step ranges whose mean ratios are the levels a sampled replay's level is predicted from: each
    calibration run's PSEUDO_RUNS consecutive parts (each of at least MIN_PSEUDO_RUN_STEPS; a shorter run
    whole). Parts rather than whole runs, also for several runs: the spread of two or three whole runs is
    too uncertain to predict from (two give a Cauchy distribution, whose tails reach absurd speeds), and
    the drift within each run is evidence too."""
    out = []
    for n in segments:
        k = min(PSEUDO_RUNS, n // MIN_PSEUDO_RUN_STEPS)
        if k < 2:
            out.append(n)
        else:
            out.extend(n // k + (1 if i < n % k else 0) for i in range(k))
    return out


# Seeds 0..N-1 take evenly spread quantiles of the level's distribution, (seed + 1/2) * this mod 1 (a Weyl
# sequence: any first N of them fill [0, 1) about evenly, whatever N a replay asks for).
_GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0
# The outermost quantiles a seed takes: many seeds would otherwise reach levels (a thousandth of the
# median speed, or a thousand times it) whose replays tell nothing about the p5-p95 interval.
_EXTREME = 0.01


def predictive_level(levels: np.ndarray, seed: int) -> np.ndarray:
    """The level (per part) that sampled replay `seed` runs at: a quantile of the predictive distribution
    of a new run's level given the k levels observed (`level_quantile`), seeds spread evenly over it.
    Drawing only the observed levels would claim that the next run can be neither faster than the fastest
    nor slower than the slowest of a few runs, which k = 2-4 of them cannot show."""
    return level_quantile(levels, min(max(((seed + 0.5) * _GOLDEN) % 1.0, _EXTREME), 1.0 - _EXTREME))


def level_quantile(levels: np.ndarray, q: float) -> np.ndarray:
    """Quantile q of a new run's level given the k observed: Student-t with k - 1 degrees of freedom and
    scale s * sqrt(1 + 1/k) around their mean in log space (s: their standard deviation), the textbook
    prediction interval of one more draw; one quantile for every part."""
    from scipy.stats import t

    logs = np.log(np.maximum(levels, 1e-9))
    k = len(logs)
    spread = logs.std(axis=0, ddof=1) * np.sqrt(1.0 + 1.0 / k)
    return np.exp(logs.mean(axis=0) + spread * float(t.ppf(q, k - 1)))


class ResidualSampler:
    """Step i's multipliers (device, host, gap) for one seeded replay: one level (`predictive_level`),
    times blocks of consecutive within-run ratios, each block from a random start inside one run."""

    def __init__(self, table: ResidualTable, seed: int) -> None:
        ratios = np.asarray(table.ratios, dtype=float).reshape(-1, len(PARTS))
        self.block = table.block_steps
        segments = table.segments or [len(ratios)]
        bounds = np.cumsum([0, *segments])
        # Valid block starts: a block never runs across the end of a trace.
        self.starts = np.concatenate([np.arange(lo, max(lo + 1, hi - self.block + 1))
                                      for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo])
        self.rng = np.random.default_rng(seed)
        level_segments = levels_from(segments)
        levels = run_levels(ratios, level_segments)
        self.ratios = ratios
        if len(levels) > 1:  # this replay runs at one level; the scatter is relative to each run's own
            own = np.repeat(levels, [n for n in level_segments if n > 0], axis=0)
            self.ratios = ratios / own * predictive_level(levels, seed)
        self.drawn: list[np.ndarray] = []

    def at(self, step: int) -> np.ndarray:
        while len(self.drawn) <= step:
            s = int(self.starts[self.rng.integers(len(self.starts))])
            self.drawn.extend(self.ratios[s:s + self.block])
        return self.drawn[step]


class ResidualScaled(CostModelDefaults):
    """Any cost model's step times scaled by sampled device ratios of a calibration profile: the scatter
    a real machine showed, laid over a model (e.g. the roofline) that has none of its own."""

    has_residuals = True

    def __init__(self, base: CostModel, table: ResidualTable, seed: int) -> None:
        self.base = base
        self.sampler = ResidualSampler(table, seed)
        self.seed = seed
        self.name = f"{base.name}+residuals"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """The base's step scaled by the drawn device ratio, part by part."""
        t, m = self.base.step_time(batch, step), float(self.sampler.at(step)[0])
        return StepTiming(t.device * m, t.host * m, t.gap * m)

    def describe(self) -> CostModelInfo:
        info = self.base.describe()
        return replace(info, name=self.name, meta={**info.meta, "residual_seed": self.seed})

    # The base's capabilities, but not its decode_step_times: those would be the unscaled times.
    @property
    def follows_recorded_schedule(self) -> bool:
        return self.base.follows_recorded_schedule

    def step_start(self, step: int) -> float | None:
        return self.base.step_start(step)

    @property
    def intake(self) -> Intake | None:
        return self.base.intake

    @property
    def max_model_len(self) -> int | None:
        return self.base.max_model_len

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int | None:
        return self.base.num_gpu_blocks(block_size, gpu_memory_utilization, max_num_batched_tokens, kv_cache_memory)

    def range_warning(self) -> str | None:
        return self.base.range_warning()
