"""Parser pieces `sim replay` and `sim plan` share: the engine's scheduler/cache flags, derived from
engine.core's SchedulerConfig/CacheConfig (same names, types, choices and help as `engine run`), vLLM's
layout and dtype flags (a Deployment), and config errors reworded to name the flag."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from engine.core.config import CacheConfig, SchedulerConfig, engine_flags
from engine.core.flags import Flag, OneLineParser, add_flags, flag_error

if TYPE_CHECKING:
    from sim.cost_models.deployment import Deployment

__all__ = ["OneLineParser", "add_deployment_flags", "add_engine_flags", "config_error", "deployment_of", "layout_change",
           "recorded_or_flag", "sim_flags"]


def sim_flags(command: str = "replay") -> tuple[Flag, ...]:
    """The engine flags that mean something to `sim COMMAND` (none takes, e.g., --kv-cache-memory)."""
    return tuple(fl for fl in engine_flags() if fl.sim is True or fl.sim == command)


def add_engine_flags(p: argparse.ArgumentParser, command: str) -> None:
    """Every default is None: "from the source trace, else the engine default"."""
    g = p.add_argument_group("engine flags (as in `engine run`; unset: the source trace's value, else the engine default)")
    add_flags(g, sim_flags(command), unset_default=True)
    g.add_argument("--seed", type=int, default=None, help="seed of the fabricated tokens")


def recorded_or_flag(owner: type[SchedulerConfig] | type[CacheConfig], args: argparse.Namespace,
                     recorded: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """`owner`'s fields given by a flag, else recorded in the source trace's config; unset ones are left
    out, so the dataclass's own default applies."""
    out = {}
    for fl in sim_flags("replay"):
        if fl.owner == owner.__name__ and fl.field not in skip:
            value = getattr(args, fl.dest)
            value = recorded.get(fl.field) if value is None else value
            if value is not None:
                out[fl.field] = value
    return out


def config_error(e: ValueError) -> ValueError:
    return flag_error(e, sim_flags())


# vLLM's layout and dtype flags: the Deployment field each sets.
DEPLOYMENT_FLAGS = {"tensor_parallel_size": "--tensor-parallel-size", "data_parallel_size": "--data-parallel-size",
                    "enable_expert_parallel": "--enable-expert-parallel", "kv_cache_dtype": "--kv-cache-dtype",
                    "quantization": "--quantization", "routing": "--routing"}


def add_deployment_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's parallel-layout and dtype flags, with vLLM's meaning; each defaults to what the source
    trace (an imported run included) recorded, else vLLM's default."""
    p.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="shard attention, dense layers and KV heads over N GPUs per data-parallel rank, two "
                   "all-reduces per layer (default: the trace's, else 1)")
    p.add_argument("--data-parallel-size", type=int, default=None, metavar="N",
                   help="N engine cores, each its own scheduler and KV cache, stepping in lockstep; a mixture of "
                   "experts shares its MoE layers over all of them (default: the trace's, else 1)")
    p.add_argument("--enable-expert-parallel", action="store_true", default=None,
                   help="split a mixture of experts' experts over the data x tensor parallel GPUs instead of "
                   "splitting each expert's width (default: the trace's, else off)")
    p.add_argument("--kv-cache-dtype", default=None, choices=("auto", "fp8"),
                   help="fp8: one byte per KV value (twice the capacity, half the attention reads) (default: the "
                   "trace's, else auto: the model's dtype)")
    p.add_argument("--quantization", default=None, choices=("fp8", "none"),
                   help="fp8: linear weights at one byte, GEMMs at the GPU's FP8 peak (default: the trace's, else none)")
    p.add_argument("--routing", default=None, metavar="balanced|zipf:S|TRACE_DIR",
                   help="how a mixture of experts' tokens pick experts, for the distinct experts a batch activates: "
                   "balanced (uniform), zipf:S (expert popularity a Zipf law of exponent S) or the counts an engine "
                   "trace of the model recorded (default: balanced)")


def deployment_of(args: argparse.Namespace | None, recorded: dict[str, Any]) -> Deployment:
    """The layout and dtypes simulated: each flag given (`args` None: none), else what the source trace
    recorded (its config's model and parallel entries), else vLLM's default."""
    from sim.cost_models.deployment import Deployment

    given: dict[str, Any] = {k: getattr(args, k) for k in DEPLOYMENT_FLAGS} if args is not None else {}

    def value(name: str) -> Any:
        return given[name] if given.get(name) is not None else recorded.get(name)

    quantization = value("quantization")
    return Deployment(
        tensor_parallel_size=int(value("tensor_parallel_size") or 1),
        data_parallel_size=int(value("data_parallel_size") or 1),
        enable_expert_parallel=bool(value("enable_expert_parallel")),
        kv_cache_dtype="fp8" if str(value("kv_cache_dtype") or "auto").startswith("fp8") else "auto",
        quantization=None if quantization in (None, "none") else str(quantization),
        routing=given.get("routing") or "balanced")


def layout_change(given: Deployment, ran: Deployment) -> str:
    """The flags by which `given` departs from the layout the source ran with, as typed."""
    return " ".join(f"{flag} {getattr(given, name)}" for name, flag in DEPLOYMENT_FLAGS.items()
                    if getattr(given, name) != getattr(ran, name))
