"""How fast the TUI opens a big trace, switches tabs and moves one step.

Writes synthetic traces of 100,000 and 665,000 steps (the whole Azure conversation replay's size) in the
trace directory format (tables built with numpy and written straight to Parquet: running a scheduler for
665k steps would take minutes), and any existing trace given with `--trace`, then measures each with
Textual's pilot in a headless terminal:
  open: loading the trace, indexing it and mounting the app until the first screen is drawn;
  first switch: from the middle step, the first switch to each tab (what it builds on first use included);
  step: single-step moves on each tab, from a key event posted to the app until the step has moved, every
        widget has handled its messages and the screen is redrawn (`pilot.pause(0)`).
        `pilot.press` is timed too, but it sleeps at least 2 x 20 ms to detect CPU idleness.
Usage: python bench/tui_speed.py [--steps N,M] [--concurrency C] [--trace DIR ...] [--moves K]"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traces.schema import FORMAT_VERSION  # noqa: E402


def _lists(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=pa.int64()))


def _empty_lists(k: int) -> pa.ListArray:
    return _lists(np.zeros(k + 1, np.int64), np.zeros(0, np.int64))


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated aranges start[i] .. start[i]+count[i]-1, and the list offsets over them."""
    offsets = np.r_[0, np.cumsum(counts)]
    idx = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    return np.repeat(starts, counts) + idx, offsets


def _ceil(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


@dataclass(slots=True)
class Plan:
    """Who runs when: request i starts at step t0[i] (a prefill of p[i] tokens), decodes one token per
    step and finishes at t0[i] + o[i] - 1, holding blocks from base[i] of its slot's block range."""
    num_steps: int
    block_size: int
    t0: np.ndarray
    p: np.ndarray
    o: np.ndarray
    base: np.ndarray
    rid: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @property
    def finish(self) -> np.ndarray:
        return self.t0 + self.o - 1


def _plan(num_steps: int, concurrency: int, block_size: int, num_blocks: int, seed: int) -> Plan:
    """Slots of a continuous batch, each running requests back to back."""
    rng = np.random.default_rng(seed)
    per_slot = (num_blocks - 1) // concurrency
    reqs = []
    for slot in range(concurrency):
        t = int(rng.integers(0, 8))
        while t < num_steps:
            o = int(rng.integers(16, 256))
            reqs.append((slot, t, min(int(rng.integers(32, 1024)), per_slot * block_size - o), o))
            t += o + int(rng.integers(0, 3))
    reqs.sort(key=lambda r: (r[1], r[0]))
    slot, t0, p, o = (np.array(c, np.int64) for c in zip(*reqs))
    live = t0 < num_steps
    tokens = np.bincount(t0[live], weights=p[live], minlength=num_steps) + _decode_counts(t0, o, num_steps)
    dur = 0.004 + tokens * 2e-6 + rng.gamma(2.0, 0.0005, num_steps)
    end = np.cumsum(dur)
    rid = np.array([f"req-{i}" for i in range(len(t0))], dtype=object)
    return Plan(num_steps, block_size, t0, p, o, 1 + slot * per_slot, rid, end - dur, end)


def _decode_counts(t0: np.ndarray, o: np.ndarray, num_steps: int) -> np.ndarray:
    steps, _ = _ranges(t0 + 1, o - 1)
    return np.bincount(steps[steps < num_steps], minlength=num_steps)


def _steps_table(pl: Plan, num_blocks: int, rng: np.random.Generator) -> tuple[pa.Table, np.ndarray]:
    n = pl.num_steps
    live = pl.t0 < n
    prefill = np.bincount(pl.t0[live], weights=pl.p[live], minlength=n).astype(np.int64)
    decode = _decode_counts(pl.t0, pl.o, n)
    kv = np.zeros(n, np.int64)
    for s0, p, o in zip(pl.t0[live], pl.p[live], pl.o[live]):
        hi = min(s0 + o - 1, n)
        kv[s0:hi] += _ceil(p + np.arange(hi - s0), pl.block_size)
    queued = pl.start[np.minimum(pl.t0, n - 1)] - rng.exponential(0.05, len(pl.t0))
    admitted = np.bincount(pl.t0[live], minlength=n)
    waiting = np.searchsorted(np.sort(queued), pl.start, "right") - np.cumsum(admitted)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, np.minimum(pl.t0, n), 1)
    np.add.at(delta, np.minimum(pl.finish, n), -1)
    dur = pl.end - pl.start
    zeros = np.zeros(n, np.int64)
    return pa.table({
        "step": np.arange(n), "start": pl.start, "end": pl.end, "num_prefill_tokens": prefill,
        "num_decode_tokens": decode, "num_scheduled_tokens": prefill + decode,
        "num_running": np.cumsum(delta)[:n], "num_waiting": np.maximum(waiting, 0), "num_preempted": zeros,
        "kv_blocks_used": kv, "kv_blocks_total": np.full(n, num_blocks - 1), "prefix_hit_tokens": zeros,
        "num_new_reqs": admitted, "num_finished": np.bincount(pl.finish[pl.finish < n], minlength=n),
        "schedule_time": dur * 0.02, "execute_time": dur * 0.95, "sample_time": dur * 0.03}), queued


def _decision_and_block_tables(pl: Plan) -> tuple[pa.Table, pa.Table]:
    """Prefill rows (all first blocks), decode rows (a block when a decode starts one), finish rows;
    and the matching `new` / `free` block events."""
    n, bs = pl.num_steps, pl.block_size
    pre = pl.t0 < n
    fin = pl.finish < n
    dec_steps, _ = _ranges(pl.t0 + 1, pl.o - 1)
    owner = np.repeat(np.arange(len(pl.t0)), pl.o - 1)
    keep = dec_steps < n
    dec_steps, owner = dec_steps[keep], owner[keep]
    computed = pl.p[owner] + dec_steps - pl.t0[owner] - 1
    gains = computed % bs == 0
    gain_ids = pl.base[owner] + computed // bs
    pre_ids, pre_off = _ranges(pl.base[pre], _ceil(pl.p[pre], bs))
    fin_ids, fin_off = _ranges(pl.base[fin], _ceil((pl.p + pl.o - 1)[fin], bs))
    pre_lists, fin_lists = _lists(pre_off, pre_ids), _lists(fin_off, fin_ids)
    n_pre, n_dec, n_fin = int(pre.sum()), len(dec_steps), int(fin.sum())
    steps = np.r_[pl.t0[pre], dec_steps, pl.finish[fin]]
    order = np.lexsort((np.r_[np.zeros(n_pre), np.ones(n_dec), np.full(n_fin, 2)], steps))
    decisions = pa.table({
        "step": steps, "request_id": np.r_[pl.rid[pre], pl.rid[owner], pl.rid[fin]].astype(str),
        "event": np.r_[["schedule"] * (n_pre + n_dec), ["finish"] * n_fin],
        "num_tokens": np.r_[pl.p[pre], np.ones(n_dec, np.int64), np.zeros(n_fin, np.int64)],
        "phase": pa.array([*["prefill"] * n_pre, *["decode"] * n_dec, *[None] * n_fin], pa.string()),
        "num_computed_tokens": np.r_[np.zeros(n_pre), computed, np.full(n_fin, np.nan)],
        "prefix_hit_tokens": np.zeros(n_pre + n_dec + n_fin, np.int64),
        "blocks_gained": pa.concat_arrays([pre_lists, _lists(np.r_[0, np.cumsum(gains)], gain_ids[gains]),
                                           _empty_lists(n_fin)]),
        "blocks_freed": pa.concat_arrays([_empty_lists(n_pre + n_dec), fin_lists]),
        "finish_reason": pa.array([*[None] * (n_pre + n_dec), *["length"] * n_fin], pa.string()),
    }).take(pa.array(order))
    n_gain = int(gains.sum())
    ev_steps = np.r_[pl.t0[pre], dec_steps[gains], pl.finish[fin]]
    ev_order = np.lexsort((np.r_[np.zeros(n_pre + n_gain), np.ones(n_fin)], ev_steps))
    sorted_steps = ev_steps[ev_order]
    events = pa.table({
        "step": sorted_steps, "seq": np.arange(len(ev_order)) - np.searchsorted(sorted_steps, sorted_steps),
        "kind": np.r_[["new"] * (n_pre + n_gain), ["free"] * n_fin][ev_order],
        "request_id": np.r_[pl.rid[pre], pl.rid[owner][gains], pl.rid[fin]].astype(str)[ev_order],
        "block_ids": pa.concat_arrays([pre_lists, _lists(np.arange(n_gain + 1), gain_ids[gains]), fin_lists])
        .take(pa.array(ev_order)),
        "hashes": pa.nulls(len(ev_order), pa.list_(pa.string()))})
    return decisions, events


def _snapshots(pl: Plan, every: int = 1024) -> pa.Table:
    rows: dict[str, list] = {"step": [], "block_id": [], "holders": [], "cached": []}
    for s in range(0, pl.num_steps, every):
        for r in np.flatnonzero((pl.t0 <= s) & (pl.finish > s)):
            nb = int(_ceil(pl.p[r] + s - pl.t0[r], pl.block_size))
            rows["step"] += [s] * nb
            rows["block_id"] += range(pl.base[r], pl.base[r] + nb)
            rows["holders"] += [[pl.rid[r]]] * nb
            rows["cached"] += [False] * nb
    return pa.table({**rows, "hash": pa.nulls(len(rows["step"]), pa.string())})


def _requests_table(pl: Plan, queued: np.ndarray) -> pa.Table:
    n, k = pl.num_steps, len(pl.t0)
    started, fin = pl.t0 < n, pl.finish < n
    out = np.where(fin, pl.o, np.clip(n - pl.t0, 0, pl.o))
    prompt_ids, prompt_off = _ranges(np.full(k, 100), pl.p)
    out_ids, out_off = _ranges(np.full(k, 7), out)
    first = np.minimum(pl.t0, n - 1)
    return pa.table({
        "request_id": pl.rid.astype(str), "arrival": queued, "queued": queued,
        "first_scheduled": np.where(started, pl.start[first], np.nan),
        "first_token": np.where(started, pl.end[first], np.nan),
        "finish": np.where(fin, pl.end[np.minimum(pl.finish, n - 1)], np.nan),
        "num_prompt_tokens": pl.p, "num_output_tokens": out, "num_cached_tokens": np.zeros(k, np.int64),
        "num_preemptions": np.zeros(k, np.int64),
        "finish_reason": pa.array(np.where(fin, "length", None).tolist(), pa.string()),
        "priority": np.zeros(k, np.int64), "max_tokens": pl.o, "error": pa.nulls(k, pa.string()),
        "prompt_token_ids": _lists(prompt_off, prompt_ids), "output_token_ids": _lists(out_off, out_ids)})


def write_big_trace(path: Path, num_steps: int = 100_000, concurrency: int = 16, block_size: int = 16,
                    num_blocks: int = 8192, seed: int = 0) -> dict[str, int]:
    """A trace of `num_steps` steps of a continuous batch of `concurrency` requests. No preemptions or
    prefix hits: it is for timing; its queues and block pool are consistent with its counters."""
    path.mkdir(parents=True, exist_ok=True)
    pl = _plan(num_steps, concurrency, block_size, num_blocks, seed)
    steps, queued = _steps_table(pl, num_blocks, np.random.default_rng(seed + 1))
    decisions, events = _decision_and_block_tables(pl)
    tables = {"steps": steps, "decisions": decisions, "requests": _requests_table(pl, queued),
              "block_events": events, "block_snapshots": _snapshots(pl)}
    for name, table in tables.items():
        pq.write_table(table, path / f"{name}.parquet")
    meta = {"format_version": FORMAT_VERSION, "source": "sim", "complete": True, "num_steps": num_steps,
            "config": {"model": {"model": "synthetic", "architecture": "LlamaForCausalLM"},
                       "scheduler": {"policy": "fcfs", "max_num_seqs": concurrency},
                       "cache": {"block_size": block_size, "num_gpu_blocks": num_blocks}},
            "device": {"type": "synthetic"}, "workload": {"name": "tui_speed", "num_requests": len(pl.t0)},
            "cost_model": {"name": "synthetic"}}
    (path / "meta.json").write_text(json.dumps(meta, indent=2))
    return {name: t.num_rows for name, t in tables.items()}


TAB_KEYS = {"step": "1", "blocks": "2", "request": "3", "run": "4"}


@dataclass(slots=True)
class Timings:
    """Seconds: opening until the first screen is drawn; the first switch to each tab; single-step moves
    on each tab, key event to redrawn screen; the same moves through `pilot.press`."""
    open: float
    first_switch: dict[str, float]
    steps: dict[str, list[float]]
    pressed: list[float]


async def _settled(app, pilot, moved) -> None:
    """Wait until `moved()` holds, then until every widget has handled its messages and redrawn."""
    while not moved():
        await asyncio.sleep(0)
    await pilot.pause(0)


async def measure(path: Path, moves: int) -> Timings:
    """Open `path`, go to its middle step, switch to each tab once, then step back and forth on each."""
    from textual import events

    from tui.app import StepscopeApp
    from tui.loader import open_trace
    from tui.model import RunIndex

    t0 = time.perf_counter()
    app = StepscopeApp(RunIndex(open_trace(path)))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0)
        opened = time.perf_counter() - t0
        run = app.current
        await pilot.press("g", *str(int(run.step_no[run.n // 2])), "enter")
        await pilot.pause()
        await pilot.press("s", *str(run.decisions_at(app.pos)["request_id"].iloc[0]), "enter")
        await pilot.pause()
        first, steps, pressed = {}, {}, []
        for tab in ("blocks", "request", "run", "step"):
            t = time.perf_counter()
            app.post_message(events.Key(TAB_KEYS[tab], TAB_KEYS[tab]))
            await _settled(app, pilot, lambda tab=tab: app.active_tab == tab)
            first[tab] = time.perf_counter() - t
        for tab in ("step", "blocks", "request"):
            await pilot.press(TAB_KEYS[tab])
            await pilot.pause()
            steps[tab] = []
            for k in range(moves):
                key = "n" if k % 4 != 3 else "p"
                before = app.pos
                t = time.perf_counter()
                app.post_message(events.Key(key, key))
                await _settled(app, pilot, lambda before=before: app.pos != before)
                steps[tab].append(time.perf_counter() - t)
                if tab == "step":
                    t = time.perf_counter()
                    await pilot.press(key)
                    await pilot.pause(0)
                    pressed.append(time.perf_counter() - t)
    return Timings(opened, first, steps, pressed)


def _cold_import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import tui.app, tui.loader; print(time.perf_counter() - t)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def report(label: str, t: Timings) -> None:
    print(f"{label} open: {t.open:.2f} s")
    for tab, secs in t.first_switch.items():
        print(f"{label} first switch to {tab}: {secs * 1e3:.0f} ms")
    for tab, secs in t.steps.items():
        print(f"{label} step on {tab}: {statistics.median(secs) * 1e3:.1f} ms (median of {len(secs)} single-step "
              f"moves, key event to redrawn screen; max {max(secs) * 1e3:.1f} ms)")
    print(f"{label} pilot.press: {statistics.median(t.pressed) * 1e3:.1f} ms (the step tab's moves through "
          f"pilot.press, which adds its own CPU-idle detection: two sleeps of at least 20 ms)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="100000,665000", help="comma-separated sizes of synthetic traces")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--trace", type=Path, action="append", default=[],
                    help="also measure this existing trace directory (repeatable)")
    ap.add_argument("--moves", type=int, default=20)
    args = ap.parse_args(argv)
    print(f"load: {_load()}")
    print(f"imports: {_cold_import_seconds():.2f} s (a fresh interpreter importing the TUI: Textual, pandas, pyarrow)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.steps.split(",") if x):
            path = Path(tmp) / f"big-{n}"
            t = time.perf_counter()
            shape = write_big_trace(path, n, args.concurrency)
            print(f"wrote {n}-step trace: {shape} in {time.perf_counter() - t:.1f} s")
            report(f"{n} steps", asyncio.run(measure(path, args.moves)))
            shutil.rmtree(path)
    for path in args.trace:
        report(str(path), asyncio.run(measure(path, args.moves)))


def _load() -> str:
    """The machine's load averages, as the other benches note them."""
    one, five, _ = os.getloadavg()
    return f"{one:.2f} {five:.2f} (1 and 5 min averages, {os.cpu_count()} cores)"


if __name__ == "__main__":
    main()
