"""How many distinct experts a batch activates: the number a fused MoE block's time follows (each
activated expert's weights are read once, whatever its token count), so the price of a sparse layer is
a price of routing. Three models: balanced (each token's top-k uniform over the experts), skewed (expert
popularity a Zipf law), or the counts an engine trace recorded for each batch size (`--routing TRACE_DIR`).

Under expert parallelism each rank holds a slice of the experts and the step waits for the busiest:
`rank_load` gives the distinct experts and the share of routed (token, expert) pairs of that rank.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol


def expected_activated(tokens: float, experts: int, top_k: int) -> float:
    """Balanced routing: each of `tokens` tokens picks `top_k` of `experts` uniformly, so an expert stays
    untouched with probability (1 - k/E)^T."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** tokens)


class RoutingModel(Protocol):
    name: str

    def rank_load(self, tokens: float, experts: int, top_k: int, ranks: int) -> tuple[float, float]:
        """(distinct experts activated, share of the routed pairs) on the busiest of `ranks` ranks that
        split `experts` evenly, for a batch of `tokens` tokens each routed to `top_k`."""
        ...


@dataclass(slots=True)
class Balanced:
    name: str = "balanced"

    def rank_load(self, tokens: float, experts: int, top_k: int, ranks: int) -> tuple[float, float]:
        return expected_activated(tokens, experts, top_k) / ranks, 1.0 / ranks


@dataclass(slots=True)
class Zipf:
    """Expert popularity p_i proportional to i^-exponent; a token includes expert i with probability
    q_i = min(1, c p_i), c set so the q_i sum to top_k. The hottest experts are spread over the ranks
    (popularity rank i on rank i mod ranks), the placement a load-aware deployment would choose; rank 0
    still holds the hottest and is the busiest."""

    exponent: float
    name: str = field(init=False)
    _cache: dict[tuple[int, int], list[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.exponent) and self.exponent >= 0):
            raise ValueError(f"routing zipf: the exponent must be a number >= 0, got {self.exponent}")
        self.name = f"zipf:{self.exponent:g}"

    def _inclusion(self, experts: int, top_k: int) -> list[float]:
        key = (experts, top_k)
        if key not in self._cache:
            weights = [(i + 1) ** -self.exponent for i in range(experts)]
            total = sum(weights)
            p = [w / total for w in weights]
            lo, hi = float(top_k), float(top_k) * experts / min(p)
            for _ in range(100):  # bisect c: sum(min(1, c p_i)) = top_k
                c = (lo + hi) / 2
                if sum(min(1.0, c * x) for x in p) < top_k:
                    lo = c
                else:
                    hi = c
            self._cache[key] = [min(1.0, hi * x) for x in p]
        return self._cache[key]

    def rank_load(self, tokens: float, experts: int, top_k: int, ranks: int) -> tuple[float, float]:
        q = self._inclusion(experts, top_k)[0::ranks]  # rank 0's experts
        if tokens <= 0:
            return 0.0, sum(q) / top_k
        return sum(1.0 - (1.0 - x) ** tokens for x in q), sum(q) / top_k


@dataclass(slots=True)
class Recorded:
    """Distinct experts by batch tokens as an engine trace recorded them (mean per token count, over all
    experts), interpolated in log tokens; a rank holds its share, the load assumed even across ranks."""

    tokens: list[int]
    activated: list[float]
    name: str = "recorded"

    def at(self, tokens: float) -> float:
        xs, ys = self.tokens, self.activated
        if tokens <= xs[0]:
            return ys[0] * tokens / xs[0]
        if tokens >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, tokens)
        w = (math.log(tokens) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
        return ys[i - 1] + w * (ys[i] - ys[i - 1])

    def rank_load(self, tokens: float, experts: int, top_k: int, ranks: int) -> tuple[float, float]:
        return min(self.at(tokens), experts) / ranks, 1.0 / ranks


@lru_cache(maxsize=8)
def recorded_routing(path: str) -> Recorded:
    """The distinct experts per MoE layer an engine trace recorded (its steps' moe_experts_active_mean),
    averaged over the steps of each token count. Read once per path: a Deployment checks its routing when
    made and each cost model asks for it again."""
    import traces

    steps = traces.load(path).steps
    column = "moe_experts_active_mean"
    if column not in steps.columns or steps[column].isna().all():
        raise ValueError(f"--routing {path}: the trace recorded no MoE routing (a dense model, a simulated run, "
                         "or a trace from before the counters)")
    steps = steps[steps[column].notna() & (steps["num_scheduled_tokens"] > 0)]
    by_tokens = steps.groupby("num_scheduled_tokens")[column].mean().sort_index()
    return Recorded([int(t) for t in by_tokens.index], [float(a) for a in by_tokens], name=f"recorded:{path}")


def routing_model(spec: str) -> RoutingModel:
    """`balanced`, `zipf:EXPONENT`, or an engine trace directory whose steps recorded MoE routing."""
    if spec == "balanced":
        return Balanced()
    if spec and not spec.startswith("zipf:") and Path(spec).is_dir():
        return recorded_routing(spec)
    kind, _, value = spec.partition(":")
    if kind == "zipf":
        try:
            return Zipf(float(value))
        except ValueError:
            pass
    raise ValueError(f"--routing: balanced, zipf:EXPONENT (e.g. zipf:1.2) or an engine trace directory, got {spec!r}")
