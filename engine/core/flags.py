"""Command-line options derived from config dataclass fields, so each option is declared once.

A field declared with `option(...)` carries its help text, its vLLM flag name (when it differs from the
field's name) and its `choices` in the field metadata; `engine run`, `sim replay` and `sim plan` build
their parsers from that metadata, and config errors naming a field are reworded to name the flag.
Torch-free: the simulator builds its parsers from here.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field
from functools import cache
from typing import Any, NoReturn

_TYPES = {"int": int, "int | None": int, "float": float, "float | None": float, "bool": bool, "bool | None": bool}


def option(default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None,
           sim: bool | str = True) -> Any:
    """A dataclass field that is also a command-line option; `sim`: which simulator commands take it
    (True: replay and plan, False: neither, "replay": that one)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "sim": sim})


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """One option: `field` on the config class `owner`, `--flag` and `dest` on the command line."""

    field: str
    owner: str
    flag: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    sim: bool | str = True

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


@cache
def flags_of(cls: type) -> tuple[Flag, ...]:
    """The options declared on `cls`, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        meta = f.metadata
        out.append(Flag(field=meta.get("field", f.name), owner=meta.get("owner", cls.__name__),
                        flag=meta["flag"] or "--" + f.name.replace("_", "-"), type=_TYPES.get(str(f.type), str),
                        default=f.default, help=meta["help"], choices=meta["choices"], sim=meta["sim"]))
    return tuple(out)


def same_option(cls: type, name: str, *, default: Any = MISSING) -> Any:
    """The option `cls.name` declared again on another dataclass (EngineArgs) with the same flag, help,
    choices and default (`default` overrides it, e.g. None meaning "the model's")."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = {**f.metadata, "field": name, "owner": cls.__name__}
    return field(default=f.default if default is MISSING else default, metadata=meta)


def add_flags(parser: Any, flags: Iterable[Flag], *, unset_default: bool = False) -> None:
    """Add each flag; `unset_default`: every default is None (the caller fills it from elsewhere)."""
    for fl in flags:
        kw: dict[str, Any] = {"dest": fl.dest, "default": None if unset_default else fl.default, "help": fl.help}
        if fl.type is bool:
            parser.add_argument(fl.flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            parser.add_argument(fl.flag, type=fl.type, choices=fl.choices, **kw)


def flag_error(e: ValueError, flags: Iterable[Flag]) -> ValueError:
    """Config errors start with a dataclass field's name; say the flag instead."""
    name, sep, rest = str(e).partition(": ")
    flag_of = {fl.field: fl.flag for fl in flags}
    return ValueError(f"{flag_of[name]}: {rest}") if sep and name in flag_of else e


def check_choice(value: Any, fl: Flag) -> None:
    """The same check argparse makes, for values that come from Python (`LLM(dtype=...)`)."""
    if fl.choices is not None and value not in fl.choices:
        raise ValueError(f"{fl.field}: must be one of {', '.join(fl.choices)}, got {value!r}")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage block) and exits 2, names the subcommand
    that was given it (`sim replay: error: ...`) with the nearest flag it knows, and takes no
    abbreviation: a flag that is not spelled out is refused, never silently read as another."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._chosen(ns)
            parser.error(parser.unrecognized(extras))
        return ns

    def _chosen(self, ns: argparse.Namespace) -> OneLineParser:
        """The (sub)parser of the subcommand the namespace says was chosen: leftovers are its to report."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(ns, action.dest, None) or "")
                if isinstance(chosen, OneLineParser):
                    return chosen._chosen(ns)
        return self

    def unrecognized(self, extras: list[str]) -> str:
        """`unrecognized argument --max-num-seq (did you mean --max-num-seqs?)`: the first leftover flag,
        with the closest option string of this parser; leftovers with no flag among them, as they are."""
        flag = next((x for x in extras if x.startswith("-") and len(x) > 1), None)
        if flag is None:
            return f"unrecognized argument{'s' if len(extras) > 1 else ''} {' '.join(extras)}"
        options = [o for a in self._actions for o in a.option_strings]
        near = difflib.get_close_matches(flag.split("=", 1)[0], options, n=1)
        return f"unrecognized argument {flag}" + (f" (did you mean {near[0]}?)" if near else "")
