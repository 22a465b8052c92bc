"""Parser pieces `sim replay` and `sim plan` share: the engine's scheduler/cache flags, derived from
engine.core's SchedulerConfig/CacheConfig (same names, types, choices and help as `engine run`), and
config errors reworded to name the flag."""
from __future__ import annotations

import argparse
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig, engine_flags
from engine.core.flags import Flag, OneLineParser, add_flags, flag_error

__all__ = ["OneLineParser", "add_engine_flags", "config_error", "recorded_or_flag", "sim_flags"]


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
