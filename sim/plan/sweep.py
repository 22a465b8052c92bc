"""Sweeps: which configurations (parsed from `--sweep`), and where they run — inline, on local processes
(concurrent.futures) or on a Ray cluster — with every finished configuration appended to a JSON-lines
results file, so an interrupted sweep resumes where it stopped.

A task is `fn(spec, config: PlanConfig) -> result dict`, deterministic, so the backend changes nothing but the wall
time; results arrive in completion order and callers sort them.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from sim.plan.config import SWEEP_KEYS, PlanConfig, field_type
from sim.plan.results import MAX_LINE_BYTES, record, torn
from sim.plan.search import ConfigResult, PlanSpec

# What `--sweep` parses a value into (sim.plan.config.field_type): a PlanConfig field's value.
SweepValue = int | float | bool | str

# A sweep is one simulation search per configuration: past these it is a typo (1..100000000), and would
# exhaust memory before the first result.
MAX_CONFIGS = 10_000
MAX_JOBS = 1024
RAY_CONNECT_TIMEOUT_S = 10.0

_BOOLS = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}


def _value(key: str, text: str) -> list[SweepValue]:
    kind = field_type(key)
    if kind is int:
        m = re.fullmatch(r"(\d+)\.\.(\d+)", text)
        if m:
            lo, hi = int(m[1]), int(m[2])
            if lo > hi:
                raise ValueError(f"--sweep: empty range {text!r} for {key}")
            if hi - lo + 1 > MAX_CONFIGS:
                raise ValueError(f"--sweep: {key}={text} is {hi - lo + 1:,} values; a sweep runs at most "
                                 f"{MAX_CONFIGS:,} configurations")
            return list(range(lo, hi + 1))
        if not text.isdigit():
            raise ValueError(f"--sweep: {key} takes integers or LO..HI, got {text!r}")
        return [int(text)]
    if kind is bool:
        if text.lower() not in _BOOLS:
            raise ValueError(f"--sweep: {key} takes true/false, got {text!r}")
        return [_BOOLS[text.lower()]]
    if kind is float:
        try:
            return [float(text)]
        except ValueError:
            raise ValueError(f"--sweep: {key} takes numbers, got {text!r}") from None
    return [text]


def parse_sweep(text: str) -> dict[str, list[SweepValue]]:
    """`replicas=1..4,max_num_seqs=64,128,router=round_robin` -> {key: values}: a part with `=` starts
    a key, the parts after it until the next key are more values of it."""
    out: dict[str, list[SweepValue]] = {}
    key = None
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"--sweep: empty value in {text!r}")
        if "=" in part:
            key, _, part = part.partition("=")
            key = key.strip().replace("-", "_")
            if key not in SWEEP_KEYS:
                raise ValueError(f"--sweep: unknown parameter {key!r} (expected one of {', '.join(SWEEP_KEYS)})")
            if key in out:
                raise ValueError(f"--sweep: {key} given twice")
            out[key] = []
        elif key is None:
            raise ValueError(f"--sweep: {part!r} is not KEY=VALUE[,VALUE...]")
        out[key].extend(_value(key, part.strip()))
    return out


def parse_price(text: str) -> dict[str, float]:
    """`h200=3.5/h,h100=2.4` -> dollars per GPU-hour by hardware name."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"\$?([A-Za-z0-9._-]+)=\$?(\d+(?:\.\d*)?|\.\d+)(?:/h|/hr|/hour)?", part)
        if m is None:
            raise ValueError(f"--price: {part!r} is not HARDWARE=DOLLARS[/h] (e.g. h200=3.5/h)")
        out[m[1].lower()] = float(m[2])
    if not out:
        raise ValueError("--price: no price given (e.g. h200=3.5/h)")
    return out


def expand_configs(sweep: dict[str, list[SweepValue]], base: PlanConfig) -> list[PlanConfig]:
    """Every combination of the swept values over `base`, in a fixed order; at most MAX_CONFIGS of them,
    counted before any is made."""
    keys = sorted(sweep)
    count = math.prod(len(sweep[k]) for k in keys)
    if count > MAX_CONFIGS:
        sizes = " x ".join(f"{len(sweep[k])} {k}" for k in keys if len(sweep[k]) > 1)
        raise ValueError(f"--sweep: {sizes} = {count:,} configurations; a sweep runs at most {MAX_CONFIGS:,}")
    configs = []
    for combo in itertools.product(*(sweep[k] for k in keys)):
        values: dict[str, Any] = dict(zip(keys, combo))  # each of its field's type: parse_sweep read it so
        configs.append(dataclasses.replace(base, **values))
    return configs


def validate_config(config: PlanConfig) -> None:
    """Bad names and out-of-range flags as one-line ValueErrors, before any simulation starts."""
    from sim.cost_models.hardware import get_hardware
    from sim.cost_models.model_shape import model_shape
    from sim.core.routers import make_router

    get_hardware(str(config.hardware))
    config.deployment().rank(model_shape(config.model))
    make_router(config.router)
    if config.replicas < 1:
        raise ValueError(f"replicas: must be >= 1, got {config.replicas}")
    config.scheduler_config()
    config.cache_config(num_gpu_blocks=2)


def load_results(path: str | Path, plan_id: str | Mapping[str, str]) -> dict[str, ConfigResult]:
    """config key -> result of the configurations this plan already finished. `plan_id`: the plan's, or each
    configuration's by key (PlanSpec.fingerprint(config)); lines of another plan are skipped. Read a line
    at a time, each at most MAX_LINE_BYTES; a line that is not a result (sim.plan.results.record) is a
    ValueError naming the file and line, but for a torn last line (a sweep killed mid-write): skipped."""
    p = Path(path)
    done: dict[str, ConfigResult] = {}
    if not p.exists():
        return done
    if not p.is_file():
        raise ValueError(f"--results {path}: not a file")
    with p.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"--results {path}: line {number}: longer than {MAX_LINE_BYTES >> 20} MiB; "
                                     "not a results file")
                if torn(raw):  # the last line: readline stopped at the end of the file
                    break
            elif torn(raw[:-1]):
                raise ValueError(f"--results {path}: line {number}: a result cut short (a sweep killed while writing "
                                 "it, resumed by an older version); delete the line")
            try:
                plan, key, result = record(raw)
            except ValueError as e:
                raise ValueError(f"--results {path}: line {number}: {e}") from None
            if plan == (plan_id if isinstance(plan_id, str) else plan_id.get(key)):
                done[key] = result
    return done


def append_result(path: str | Path, plan_id: str, config: PlanConfig, result: ConfigResult) -> None:
    """One JSON line per finished configuration, flushed at once. A torn last line that a killed sweep left
    (load_results skipped it) is cut off first, so the file stays one result per line."""
    line = (json.dumps({"plan": plan_id, "key": config.key, "config": config.to_dict(), "result": result.to_json()})
            + "\n").encode()
    with open(path, "a+b") as f:
        end = f.seek(0, 2)
        if end:
            start = max(0, end - MAX_LINE_BYTES - 1)
            f.seek(start)
            tail = f.read()
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n") + 1
                if (cut or not start) and torn(tail[cut:]):
                    f.truncate(start + cut)
                else:
                    line = b"\n" + line
        f.write(line)
        f.flush()


Task = Callable[[PlanSpec, PlanConfig], ConfigResult]
Done = Callable[[PlanConfig, ConfigResult], None]


class Workers(Protocol):
    """Where configurations are evaluated, one task each: `submit` hands one over, `next_done` waits for
    any one to finish (in completion order); `pending` counts those submitted and not yet handed back."""

    @property
    def pending(self) -> int: ...

    def submit(self, fn: Task, spec: PlanSpec, config: PlanConfig) -> None: ...

    def next_done(self) -> tuple[PlanConfig, ConfigResult]: ...


class InlineWorkers:
    """In this process, one task at a time in submission order, each run when its result is asked for
    (so a caller hands each on before the next one starts)."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Task, PlanSpec, PlanConfig]] = deque()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, fn: Task, spec: PlanSpec, config: PlanConfig) -> None:
        self._queue.append((fn, spec, config))

    def next_done(self) -> tuple[PlanConfig, ConfigResult]:
        fn, spec, config = self._queue.popleft()
        return config, fn(spec, config)


class ProcessWorkers:
    """Local worker processes (concurrent.futures), kept for the whole sweep: each keeps its own cache of
    the workload's requests (and their prompt hashes) from one task to the next."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._futures: dict[Any, PlanConfig] = {}

    @property
    def pending(self) -> int:
        return len(self._futures)

    def submit(self, fn: Task, spec: PlanSpec, config: PlanConfig) -> None:
        self._futures[self._pool.submit(fn, spec, config)] = config

    def next_done(self) -> tuple[PlanConfig, ConfigResult]:
        from concurrent.futures import FIRST_COMPLETED, wait

        fut = next(iter(wait(self._futures, return_when=FIRST_COMPLETED).done))
        return self._futures.pop(fut), fut.result()

    def cancel(self) -> None:
        for fut in self._futures:
            fut.cancel()


class RayWorkers:
    """One Ray task per configuration."""

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self._remote = ray.remote(num_cpus=1)(_call)  # Ray wraps functions only; `fn` may be a callable object
        self._spec: tuple[PlanSpec, Any] | None = None  # the spec last put in Ray's object store, and its ref
        self._refs: dict[Any, PlanConfig] = {}

    @property
    def pending(self) -> int:
        return len(self._refs)

    def submit(self, fn: Task, spec: PlanSpec, config: PlanConfig) -> None:
        if self._spec is None or self._spec[0] is not spec:
            self._spec = (spec, self._ray.put(spec))
        ref = self._spec[1]
        self._refs[self._remote.remote(fn, ref, config)] = config

    def next_done(self) -> tuple[PlanConfig, ConfigResult]:
        (ref,), _ = self._ray.wait(list(self._refs), num_returns=1)
        return self._refs.pop(ref), self._ray.get(ref)


@contextmanager
def open_workers(jobs: int = 1, ray_address: str | None = None, ray_num_cpus: int | None = None) -> Iterator[Workers]:
    """Inline (`jobs` 1), `jobs` local processes, or a Ray cluster (`ray_address`; 'auto' joins a running
    cluster or starts a local one), for as long as the block runs."""
    if ray_address:
        try:
            import ray
        except ImportError:
            raise ValueError("--ray: ray is not installed (pip install ray)") from None
        started = not ray.is_initialized()
        if started and ray_address not in ("auto", "local"):
            probe_ray_address(ray_address)
        if started:
            ray.init(address=None if ray_address in ("auto", "local") else ray_address, num_cpus=ray_num_cpus,
                     include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        try:
            yield RayWorkers(ray)
        finally:
            if started:
                ray.shutdown()
    elif jobs <= 1:
        yield InlineWorkers()
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            workers = ProcessWorkers(pool)
            try:
                yield workers
            except BaseException:
                workers.cancel()
                raise


def probe_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """ray.init retries an address where nothing listens for minutes: one TCP connect, bounded in time,
    says so first (a one-line ValueError)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray {address}: expected HOST:PORT or ray://HOST:PORT, 'auto' or 'local'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ValueError(f"--ray {address}: nothing answers there ({e.strerror or e})") from None


def _call(fn: Task, spec: PlanSpec, config: PlanConfig) -> ConfigResult:
    return fn(spec, config)


def run_sweep(fn: Task, spec: PlanSpec, configs: Iterable[PlanConfig], on_done: Done, jobs: int = 1,
              ray_address: str | None = None, ray_num_cpus: int | None = None) -> None:
    """Every configuration evaluated by `fn`, each handed to `on_done` as it finishes."""
    configs = list(configs)
    if not configs:
        return
    with open_workers(min(jobs, len(configs)), ray_address, ray_num_cpus) as workers:
        for config in configs:
            workers.submit(fn, spec, config)
        while workers.pending:
            on_done(*workers.next_done())
