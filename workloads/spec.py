"""The workload YAML schema as pydantic models; extra="forbid" so a typo fails loudly instead of being ignored."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workloads.importers import MAX_SECONDS

# Every number is bounded where it is read: past these a value is a typo, and would overflow float64 arrival
# times, wrap int64 lengths, allocate without end or never finish.
MAX_REQUESTS = 10**8  # a replay of 10^8 requests already takes days
# 2^30 tokens: 100x any model's context, so an over-long prompt is still one a run refuses by its length (its
# ids are never made), and lengths times length_scale stay exact in int64.
MAX_LENGTH = 1 << 30
Count = Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
Length = Annotated[int, Field(ge=1, le=MAX_LENGTH)]  # a token count
LengthParam = Annotated[float, Field(gt=0, le=MAX_LENGTH)]  # a mean or median length
Spread = Annotated[float, Field(ge=0, le=MAX_LENGTH)]  # a standard deviation, in tokens
# Requests per second, from one in 11 days to 10^9: arrival times over 10^8 requests stay finite and ordered.
Rate = Annotated[float, Field(ge=1e-6, le=1e9)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]  # a span of time: at most about three years
Scale = Annotated[float, Field(ge=1e-6, le=1e6)]  # a factor on times or lengths
MAX_ZIPF_SUPPORT = 10_000_000
TRACE_FORMATS = ("azure", "mooncake", "csv", "jsonl", "llmservingsim")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoissonArrival(_Strict):
    """Exponential gaps: memoryless open-loop traffic."""

    process: Literal["poisson"]
    rate: Rate


class GammaArrival(_Strict):
    """Gamma gaps with a chosen coefficient of variation: cv > 1 gives bursts, cv < 1 smooths them."""

    process: Literal["gamma"]
    rate: Rate
    cv: Annotated[float, Field(ge=1e-3, le=1e3)]  # the gamma's shape 1/cv^2 stays a finite, non-zero float


class ConstantArrival(_Strict):
    """Evenly spaced arrivals: the easiest load to reason about."""

    process: Literal["constant"]
    rate: Rate


class OnOffArrival(_Strict):
    """Poisson at `rate` for `on` seconds, then silence for `off` seconds, repeated: load steps."""

    process: Literal["onoff"]
    rate: Rate
    on: Annotated[float, Field(ge=1e-3, le=MAX_SECONDS)]  # arrival times are divided by it
    off: Annotated[float, Field(ge=0, le=MAX_SECONDS)]

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, data: Any) -> Any:
        """YAML 1.1 reads the bare keys `on:`/`off:` as true/false; map them back to the field names."""
        if isinstance(data, dict) and (True in data or False in data):
            data = {{True: "on", False: "off"}.get(k, k) if isinstance(k, bool) else k: v for k, v in data.items()}
        return data


class TraceArrival(_Strict):
    """Arrivals and lengths replayed from a trace file; `time_scale` stretches (>1) or squeezes (<1) time."""

    process: Literal["trace"]
    path: str = Field(min_length=1)
    format: Literal["azure", "mooncake", "csv", "jsonl", "llmservingsim"]
    time_scale: Scale = 1.0


Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | OnOffArrival | TraceArrival,
    Field(discriminator="process"),
]


class _Clipped(_Strict):
    """`min`/`max` clip whatever a distribution draws."""

    min: Length | None = None
    max: Length | None = None

    @field_validator("max")
    @classmethod
    def _max_not_below_min(cls, v: int | None, info: ValidationInfo) -> int | None:
        lo = info.data.get("min")
        if v is not None and lo is not None and v < lo:
            raise ValueError(f"max ({v}) is below min ({lo})")
        return v


class FixedLength(_Clipped):
    dist: Literal["fixed"]
    value: Length


class UniformLength(_Clipped):
    dist: Literal["uniform"]
    min: Length
    max: Length


class NormalLength(_Clipped):
    dist: Literal["normal"]
    mean: LengthParam
    std: Spread


class LognormalLength(_Clipped):
    """Long-tailed lengths, as prompts in production traces are; `median` is exp(mu)."""

    dist: Literal["lognormal"]
    median: LengthParam
    sigma: Annotated[float, Field(ge=0, le=10)]  # past 10 nearly every draw is clipped to min or max


class ZipfLength(_Clipped):
    """P(k) proportional to k^-a on the integers [min, max]; bounded, so any a in (0, 100] works."""

    dist: Literal["zipf"]
    # k^-a is taken relative to min, so any exponent up to 100 (all weight on min) stays finite.
    a: Annotated[float, Field(gt=0, le=100)] = Field(validation_alias=AliasChoices("a", "s"))
    min: Length = 1
    max: Length

    @field_validator("max")
    @classmethod
    def _support_not_too_wide(cls, v: int, info: ValidationInfo) -> int:
        if v - info.data.get("min", 1) >= MAX_ZIPF_SUPPORT:
            raise ValueError(f"zipf support [min, max] is wider than {MAX_ZIPF_SUPPORT:,} values")
        return v


class EmpiricalLength(_Clipped):
    """Draws from given values, optionally weighted: a histogram taken from somewhere real."""

    dist: Literal["empirical"]
    values: list[Length] = Field(min_length=1)
    weights: list[Annotated[float, Field(ge=0, le=1e12)]] | None = None  # counts or shares: their sum stays finite

    @field_validator("weights")
    @classmethod
    def _weights_match_values(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        values = info.data.get("values")
        if v is not None and values is not None and len(v) != len(values):
            raise ValueError(f"has {len(v)} entries but values has {len(values)}")
        if v is not None and sum(v) <= 0:
            raise ValueError("must not all be zero")
        return v


LengthDist = Annotated[
    FixedLength | UniformLength | NormalLength | LognormalLength | ZipfLength | EmpiricalLength,
    Field(discriminator="dist"),
]


class PrefixSpec(_Strict):
    """A `fraction` of requests starts with one of `groups` shared prefixes of `tokens` tokens."""

    groups: Count
    tokens: Length
    fraction: Annotated[float, Field(ge=0, le=1)]


class WorkloadSpec(_Strict):
    """One workload file. `length_scale` multiplies every length (prompts, outputs, prefixes, trace blocks)."""

    name: str | None = None
    description: str | None = None
    seed: Annotated[int, Field(ge=0)] = 0
    num_requests: Count | None = None
    duration: Seconds | None = None
    arrival: Arrival
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    prefix: PrefixSpec | None = None
    length_scale: Scale = 1.0
