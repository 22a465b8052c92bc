"""The workload options of `engine run`, `sim replay` and `sim plan`, declared once as config fields (as
engine.core's scheduler flags are) and checked once, so every command takes and refuses them alike.
Only the command lines import this module: the workload package itself stays free of the engine, and
the workload readers load only when options are checked."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from engine.core.flags import add_flags, flags_of, option

# Which command takes which option (field names).
TAKEN_BY = {"engine run": ("time_scale", "max_requests"),
            "sim replay": ("time_scale", "max_requests", "vocab_size"),
            "sim plan": ("max_requests", "length_scale", "vocab_size")}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOptions:
    """How a command reads its workload; building one checks every option, naming its flag."""

    time_scale: float = option(1.0, "multiply arrival times (0.5: twice as fast)")
    max_requests: int | None = option(None, "the workload's first N requests only")
    vocab_size: int = option(32000, "workloads draw token ids below this")
    length_scale: float | None = option(None, "multiply prompt and output lengths")

    def __post_init__(self) -> None:
        from workloads.generate import FIRST_TOKEN_ID
        from workloads.workload import check_time_scale

        check_time_scale(self.time_scale)
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"--max-requests: must be >= 1, got {self.max_requests}")
        if self.vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"--vocab-size: must be >= {FIRST_TOKEN_ID + 1}, got {self.vocab_size}")
        if self.length_scale is not None and not self.length_scale > 0:
            raise ValueError(f"--length-scale: must be > 0, got {self.length_scale}")


def add_workload_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The options `command` takes, as `--flag`s with the declared types, defaults and help."""
    add_flags(parser, (fl for fl in flags_of(WorkloadOptions) if fl.field in TAKEN_BY[command]))


def workload_options(args: argparse.Namespace, command: str) -> WorkloadOptions:
    """The options `command` was given, checked; the others at their defaults."""
    given = {name: getattr(args, name) for name in TAKEN_BY[command]}
    return dataclasses.replace(WorkloadOptions(), **given)
