"""One trace pre-indexed for the TUI: step columns as numpy arrays, each step's decision rows found by
binary search on the sorted step column, per-request rows looked up on demand, block pool rebuilt lazily.
Nothing here scans the whole trace on a step move, so a 100k-step trace moves as fast as a small one."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from traces.metrics import latency
from traces import Trace
from traces.blocks import BlockPoolIndex, PoolState
from traces.describe import describe_run
from traces.frames import list_cell
from tui.queues import QueueIndex


@dataclass(slots=True)
class LifecycleEvent:
    """One line of a request's story: what happened, when, in which step (-1: between steps)."""
    time: float
    step: int
    kind: str
    detail: str


def as_float(v: Any) -> float:
    """A table cell as float, NaN for missing values (None, pd.NA, NaN)."""
    try:
        return math.nan if v is None or pd.isna(v) else float(v)
    except (TypeError, ValueError):
        return math.nan


def as_int(v: Any) -> int:
    """A table cell as int, 0 for missing values."""
    f = as_float(v)
    return 0 if math.isnan(f) else int(f)


class RunIndex:
    """A trace plus the indexes the views need; step positions 0..n-1 index the (sorted) steps table."""

    def __init__(self, trace: Trace, label: str = "A") -> None:
        self.trace, self.label, self.meta = trace, label, trace.meta
        steps = trace.steps
        if len(steps) and not steps["step"].is_monotonic_increasing:
            steps = steps.sort_values("step", kind="stable").reset_index(drop=True)
        self.steps = steps
        self.n = len(steps)

        def col(name: str, dtype: type = float) -> np.ndarray:
            if name not in steps.columns:
                return np.zeros(self.n, dtype)
            return steps[name].fillna(0).to_numpy(dtype=dtype)

        self.step_no = col("step", np.int64)
        self.start, self.end = col("start"), col("end")
        self.duration = self.end - self.start
        self.tokens = col("num_scheduled_tokens", np.int64)
        self.num_running = col("num_running", np.int64)
        self.num_waiting = col("num_waiting", np.int64)
        self.num_preempted = col("num_preempted", np.int64)
        self.kv_used = col("kv_blocks_used", np.int64)
        self.kv_total = col("kv_blocks_total", np.int64)
        self.kv_frac = self.kv_used / np.maximum(self.kv_total, 1)
        self.preempt_pos = np.flatnonzero(self.num_preempted > 0)
        # A MoE model's engine trace counts each step's routing; dense models, simulators and older traces do not.
        moe = steps.get("moe_experts_active_max")
        self.has_moe = moe is not None and bool(moe.notna().any())
        dec = trace.decisions
        if len(dec) and not dec["step"].is_monotonic_increasing:
            dec = dec.sort_values("step", kind="stable").reset_index(drop=True)
        self.decisions = dec
        self.d_step = dec["step"].to_numpy(np.int64)
        req = trace.requests
        self.requests = req
        self.req_pos = pd.Index(req["request_id"])
        self.req_prompt = pd.to_numeric(req["num_prompt_tokens"], errors="coerce").fillna(0).to_numpy(np.int64)
        self.req_total = self.req_prompt + pd.to_numeric(req["num_output_tokens"], errors="coerce").fillna(0).to_numpy(
            np.int64)
        self._rows_of: dict[str, np.ndarray] = {}
        self._blocks_cache: dict[int, PoolState] = {}

    # ---- run description -----------------------------------------------------------------------
    @property
    def source(self) -> str:
        return str(self.meta.get("source", "?"))

    @property
    def policy(self) -> str:
        return str(((self.meta.get("config") or {}).get("scheduler") or {}).get("policy", "fcfs"))

    @property
    def name(self) -> str:
        return f"{self.label}: {describe_run(self.meta)} · {self.trace.path.name}"

    @cached_property
    def summary(self) -> dict[str, Any]:
        from traces.summary import summarize

        return summarize(self.requests, self.steps)

    # ---- steps ---------------------------------------------------------------------------------
    def clamp(self, pos: int) -> int:
        return max(0, min(int(pos), self.n - 1))  # 0 for a trace without steps

    def pos_of_step(self, step: int) -> int:
        """Position of step number `step` (the nearest one at or before it)."""
        return self.clamp(int(np.searchsorted(self.step_no, step, side="right")) - 1)

    def step_row(self, pos: int) -> dict[str, Any]:
        return self.steps.iloc[pos].to_dict()

    def decision_range(self, pos: int) -> tuple[int, int]:
        s = self.step_no[pos]
        return int(np.searchsorted(self.d_step, s, "left")), int(np.searchsorted(self.d_step, s, "right"))

    def decisions_at(self, pos: int) -> pd.DataFrame:
        lo, hi = self.decision_range(pos)
        return self.decisions.iloc[lo:hi]

    def next_in(self, positions: np.ndarray, pos: int, direction: int = 1) -> int | None:
        """The first of sorted `positions` after `pos` (before it when direction < 0)."""
        if direction > 0:
            i = int(np.searchsorted(positions, pos, "right"))
            return int(positions[i]) if i < len(positions) else None
        i = int(np.searchsorted(positions, pos, "left")) - 1
        return int(positions[i]) if i >= 0 else None

    # ---- requests ------------------------------------------------------------------------------
    @cached_property
    def queues(self) -> QueueIndex:
        return QueueIndex(self.decisions, self.requests, self.policy)

    def total_tokens(self, rids: pd.Series) -> np.ndarray:
        """Prompt + output tokens of each request (-1 for one missing from the requests table)."""
        k = self.req_pos.get_indexer(rids)
        return np.where(k >= 0, self.req_total[k], -1)

    def has_request(self, rid: str) -> bool:
        return rid in self.req_pos

    def request(self, rid: str) -> dict[str, Any] | None:
        if rid not in self.req_pos:
            return None
        return self.requests.iloc[self.req_pos.get_loc(rid)].to_dict()

    @cached_property
    def _rid_codes(self) -> tuple[np.ndarray, pd.Index]:
        codes, uniques = pd.factorize(self.decisions["request_id"])
        return codes, pd.Index(uniques)

    def request_rows(self, rid: str) -> np.ndarray:
        """Row numbers of `rid`'s decisions, in step order (built per request on first use)."""
        rows = self._rows_of.get(rid)
        if rows is None:
            codes, uniques = self._rid_codes
            rows = np.flatnonzero(codes == uniques.get_loc(rid)) if rid in uniques else np.zeros(0, np.int64)
            self._rows_of[rid] = rows
        return rows

    def prefix_hits(self, rid: str) -> int:
        """Tokens `rid` took from the prefix cache over all its admissions (re-admissions included), as the
        steps table and the run's prefix hit rate count them."""
        rows = self.request_rows(rid)
        return int(pd.to_numeric(self.decisions["prefix_hit_tokens"].iloc[rows], errors="coerce").fillna(0).sum())

    def scheduled_positions(self, rid: str) -> np.ndarray:
        """Step positions where `rid` was scheduled."""
        rows = self.request_rows(rid)
        ev = self.decisions["event"].iloc[rows].to_numpy()
        steps = np.unique(self.d_step[rows[ev == "schedule"]])
        return np.searchsorted(self.step_no, steps)

    def lifecycle(self, rid: str) -> list[LifecycleEvent]:
        """Arrival, each prefill chunk, runs of decodes, preemptions, first token and finish, in order."""
        info = self.request(rid) or {}
        out: list[LifecycleEvent] = []
        arrival, queued = as_float(info.get("arrival")), as_float(info.get("queued"))
        if not math.isnan(arrival):
            out.append(LifecycleEvent(arrival, -1, "arrival", f"{as_int(info.get('num_prompt_tokens'))} "
                                      f"prompt tokens, priority {info.get('priority', 0)}"))
        if not math.isnan(queued) and queued != arrival:
            out.append(LifecycleEvent(queued, -1, "queued", "added to the scheduler's waiting queue"))
        rows = self.decisions.iloc[self.request_rows(rid)]
        total = as_int(info.get("num_prompt_tokens")) + as_int(info.get("num_output_tokens"))
        run: list[Any] = []

        def flush() -> None:
            """One line for a run of single-token decodes."""
            if run:
                first, last, n = run[0], run[-1], len(run)
                what = f"{n} steps of 1 token (steps {first.step}-{last.step})" if n > 1 else "1 token"
                out.append(LifecycleEvent(float(self.start[self.pos_of_step(first.step)]), int(first.step),
                                          "decode", what))
                run.clear()

        for r in rows.itertuples(index=False):
            if r.event == "schedule" and r.phase == "decode" and r.num_tokens == 1:
                run.append(r)
                continue
            flush()
            t = float(self.start[self.pos_of_step(r.step)])
            if r.event == "schedule":
                done = as_int(r.num_computed_tokens)
                hit = f", {int(r.prefix_hit_tokens)} from the prefix cache" if r.prefix_hit_tokens else ""
                n = int(r.num_tokens)
                out.append(LifecycleEvent(t, int(r.step), str(r.phase),
                                          f"{n} token{'s' * (n != 1)}, {done}->{done + n} of {total}{hit}"))
            else:
                freed = len(list_cell(r.blocks_freed))
                why = f" ({r.finish_reason})" if isinstance(r.finish_reason, str) else ""
                if isinstance(getattr(r, "preempted_for", None), str):  # traces since the column exists
                    whom = "itself" if r.preempted_for == rid else r.preempted_for
                    need = as_int(r.blocks_needed)
                    why = f" for {whom}: needed {need} block{'s' * (need != 1)}, {as_int(r.blocks_free)} free"
                out.append(LifecycleEvent(t, int(r.step), str(r.event), f"freed {freed} blocks{why}"))
        flush()
        for key, kind in (("first_token", "first token"), ("finish", "finished")):
            v = as_float(info.get(key))
            if not math.isnan(v):
                reason = f" ({info.get('finish_reason')})" if kind == "finished" else ""
                out.append(LifecycleEvent(v, -1, kind, f"at {v:.3f} s{reason}"))
        out.sort(key=lambda e: (e.time, e.kind in ("first token", "finished")))
        return out

    def latencies(self, rid: str) -> dict[str, float]:
        """Queue time, TTFT, TPOT, end-to-end (seconds; NaN where the request did not get there)."""
        info = self.request(rid) or {}
        arrival, first, ttok, fin = (as_float(info.get(k))
                                     for k in ("arrival", "first_scheduled", "first_token", "finish"))
        n = as_float(info.get("num_output_tokens"))
        return {m: float(latency(m, arrival, first, ttok, fin, n)) for m in ("queue", "ttft", "tpot", "e2e")}

    # ---- block pool ----------------------------------------------------------------------------
    @cached_property
    def block_index(self) -> BlockPoolIndex:
        """Built on first use; it converts only the events a step's replay reads."""
        total = int(self.kv_total[0]) + 1 if self.n else 1
        return BlockPoolIndex(self.trace.block_events, self.trace.block_snapshots, total)

    @property
    def num_blocks(self) -> int:
        return self.block_index.num_blocks - 1

    def blocks_at(self, pos: int) -> PoolState:
        """The pool after step `pos` (blocks 1..N-1 shown); the last few steps looked at are kept."""
        got = self._blocks_cache.get(pos)
        if got is None:
            got = self.block_index.pool_at(int(self.step_no[pos]))
            if len(self._blocks_cache) >= 8:
                self._blocks_cache.pop(next(iter(self._blocks_cache)))
            self._blocks_cache[pos] = got
        return got
