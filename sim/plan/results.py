"""What keys and what makes a line of a plan's results file (`sim plan --results FILE`, read and written
by sim.plan.sweep).

A line counts for a plan when its `plan` is the configuration's fingerprint (PlanSpec.fingerprint): the
flags and the sha256 of every input file's content (`input_digests`), so an edited workload, model
config, hardware file or residual profile is simulated again. Every line is checked when read, whichever
plan it is of (`record`): a file that is not a results file is one error naming the line, not a plan that
quietly skips it and appends to it.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sim.plan.config import PlanConfig
from sim.plan.search import ConfigResult

MAX_LINE_BYTES = 1 << 20  # a result with every point of a long search is a few KiB
LINE_START = b'{"plan": '  # how sim.plan.sweep.append_result begins every line (json.dumps keeps the order)


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def input_digests(workload: str, residual_profile: str | None, configs: Iterable[PlanConfig]) -> dict[str, str]:
    """sha256 of the content of each input file of a plan, by the name it was given as: the workload (with
    the trace file it names), the residual profile, each model config (a directory: its config.json) and
    hardware file. Hashed once, here: the digests travel in PlanSpec. A preset is not a file: its name, in
    each configuration's key, keys it. The name counts too, so an identical copy at another path is
    another input and does not match."""
    from engine.core.model_shapes import MODEL_CONFIGS
    from sim.cost_models.hardware import HARDWARE
    from workloads import load_workload

    trace = load_workload(workload).trace_path
    out = {workload: file_sha256(workload) + (f"+{file_sha256(trace)}" if trace is not None else "")}
    if residual_profile:
        out[residual_profile] = file_sha256(residual_profile)
    models = {str(c.model) for c in configs if str(c.model).lower() not in MODEL_CONFIGS}
    hardware = {str(c.hardware) for c in configs if str(c.hardware).strip().lower() not in HARDWARE}
    for name in sorted(models | hardware):
        path = Path(name)
        if name in models and path.is_dir():
            path = path / "config.json"
        if path.is_file():
            out[name] = file_sha256(path)
    return out


def torn(raw: bytes) -> bool:
    """Whether `raw` is the start of a line that append_result was writing when the sweep was killed."""
    if not raw or not (raw.startswith(LINE_START) or LINE_START.startswith(raw)):
        return False
    try:
        json.loads(raw)
    except ValueError:
        return True
    return False


def record(raw: bytes) -> tuple[str, str, ConfigResult]:
    """(plan, key, result) of one results line; a ValueError naming the field otherwise."""
    try:
        row = json.loads(raw)
    except ValueError:
        raise ValueError("not a JSON line (a results file has one JSON object per line)") from None
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    for name in ("plan", "key"):
        if not isinstance(row.get(name), str):
            raise ValueError(f"{name}: " + ("missing" if name not in row else f"must be a string, got {row[name]!r}"))
    if not isinstance(row.get("config", {}), dict):
        raise ValueError(f"config: must be an object, got {_short(row['config'])}")
    if "result" not in row:
        raise ValueError("result: missing")
    return row["plan"], row["key"], result_from_json(row["result"])


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(where: str, v: Any, *, optional: bool = False, positive: bool = False, at_most: float | None = None) -> None:
    if v is None and optional:
        return
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or (positive and v == 0)
            or (at_most is not None and v > at_most)):
        bound = f"in [0, {at_most:g}]" if at_most is not None else "> 0" if positive else ">= 0"
        raise ValueError(f"{where}: must be a finite number {bound}, got {_short(v)}")


def _object(where: str, v: Any, *, optional: bool = False) -> dict[str, Any]:
    if v is None and optional:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{where}: must be an object, got {_short(v)}")
    return v


def _headroom(where: str, room: Any) -> None:
    room = _object(where, room)
    peak = room.get("peak_running", 0)
    if isinstance(peak, bool) or not isinstance(peak, int) or peak < 0:
        raise ValueError(f"{where}.peak_running: must be an integer >= 0, got {_short(peak)}")
    for size, blocks in _object(f"{where}.peak_blocks", room.get("peak_blocks"), optional=True).items():
        if not size.isdigit() or isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
            raise ValueError(f"{where}.peak_blocks: must map block sizes to integers >= 0, got {size!r}: {_short(blocks)}")
    if not isinstance(room.get("preempted", False), bool):
        raise ValueError(f"{where}.preempted: must be true or false, got {_short(room['preempted'])}")


def result_from_json(data: Any) -> ConfigResult:
    """A results line's `result`, checked field by field (fields it lacks default, unknown ones are ignored:
    another version wrote them); a ValueError naming the field otherwise."""
    data = _object("result", data)
    if "max_rate" not in data:
        raise ValueError("result.max_rate: missing")
    _number("result.max_rate", data["max_rate"])
    if not isinstance(data.get("capped", False), bool):
        raise ValueError(f"result.capped: must be true or false, got {_short(data['capped'])}")
    for name, v in _object("result.max_rate_interval", data.get("max_rate_interval"), optional=True).items():
        for x in v if isinstance(v, list) else [v]:
            _number(f"result.max_rate_interval.{name}", x)
    _number("result.attainment", data.get("attainment", 0.0), at_most=1.0)
    _number("result.mean_output_tokens", data.get("mean_output_tokens", 0.0))
    _number("result.prefix_hit_rate", data.get("prefix_hit_rate", 0.0))
    _number("result.user_tok_s", data.get("user_tok_s"), optional=True)
    for label, v in _object("result.slo_measured", data.get("slo_measured"), optional=True).items():
        _number(f"result.slo_measured.{label}", v, optional=True)
    for reason, n in _object("result.rejected", data.get("rejected"), optional=True).items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"result.rejected.{reason}: must be an integer >= 0, got {_short(n)}")
    points = data.get("points", [])
    if not isinstance(points, list):
        raise ValueError(f"result.points: must be a list, got {_short(points)}")
    for i, point in enumerate(points):
        point = _object(f"result.points[{i}]", point)
        _number(f"result.points[{i}].rate", point.get("rate"), positive=True)
        for name, v in point.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                _number(f"result.points[{i}].{name}", v)
    if not isinstance(data.get("note"), str | None):
        raise ValueError(f"result.note: must be a string, got {_short(data['note'])}")
    if data.get("headroom") is not None:
        _headroom("result.headroom", data["headroom"])
    for rate, room in _object("result.headroom_at", data.get("headroom_at"), optional=True).items():
        try:
            _number("result.headroom_at", float(rate), positive=True)
        except ValueError:
            raise ValueError(f"result.headroom_at: keys must be rates > 0, got {rate!r}") from None
        _headroom(f"result.headroom_at[{rate}]", room)
    return ConfigResult.from_json(data)
