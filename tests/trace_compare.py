"""What the trace tests compare: two traces decide the same when their decisions and step counts agree
at every step (a recorded replay must reproduce its source run, engine or vLLM, this way)."""
from __future__ import annotations

import pandas as pd

import traces
from sim.cli import main as sim_main

STEP_COLUMNS = ["step", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens", "num_running",
                "num_waiting", "num_preempted", "kv_blocks_used", "kv_blocks_total", "prefix_hit_tokens",
                "num_new_reqs", "num_finished"]
DECISION_COLUMNS = ["step", "request_id", "event", "num_tokens", "phase", "num_computed_tokens",
                    "prefix_hit_tokens", "blocks_gained", "blocks_freed", "finish_reason"]


def as_lists(df: pd.DataFrame) -> pd.DataFrame:
    """List cells (numpy arrays after Parquet) as plain lists, so DataFrame.equals compares them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in out[c]]
    return out.reset_index(drop=True)


def first_difference(a: traces.Trace, b: traces.Trace) -> int | None:
    """The first step whose decisions or counts differ between two traces (None: identical)."""
    da, db = as_lists(a.decisions[DECISION_COLUMNS]), as_lists(b.decisions[DECISION_COLUMNS])
    sa, sb = a.steps[STEP_COLUMNS].reset_index(drop=True), b.steps[STEP_COLUMNS].reset_index(drop=True)
    for step in range(max(len(sa), len(sb))):
        rows_a, rows_b = da[da["step"] == step], db[db["step"] == step]
        if len(rows_a) != len(rows_b) or not rows_a.reset_index(drop=True).equals(rows_b.reset_index(drop=True)):
            return step
        if step >= len(sa) or step >= len(sb) or not sa.iloc[step].equals(sb.iloc[step]):
            return step
    return None


def recorded_replay(trace_dir, out) -> traces.Trace:
    """`sim replay TRACE --cost-model recorded`, loaded."""
    assert sim_main(["replay", str(trace_dir), "--cost-model", "recorded", "--trace", str(out), "--no-progress"]) == 0
    return traces.load(out)
