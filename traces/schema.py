"""Trace directory format, version 1: table names, their columns and file names (see FORMAT.md)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPANS_FILE = "spans.jsonl"
# A Parquet file being compacted is `<table>.parquet.<pid>.tmp` until renamed; readers never look at it.
TEMP_SUFFIX = ".tmp"


class StepRow(NamedTuple):
    """A row of the steps table, every column in order: version 1's, then the admission and MoE routing
    columns added after it first shipped (OPTIONAL_COLUMNS). The one place the table's layout is written."""

    step: int
    start: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_hit_tokens: int
    num_new_reqs: int
    num_finished: int
    schedule_time: float
    execute_time: float
    sample_time: float
    admission_blocked: str | None = None  # why the waiting queue stopped being admitted, and for whom
    admission_blocked_request: str | None = None
    admission_needed: int | None = None
    admission_available: int | None = None
    # A MoE model's routing, counted per MoE layer (engine.core.outputs.MoeStepStats); null for dense models,
    # simulated steps and foreign recorders.
    moe_experts_active_max: int | None = None
    moe_experts_active_mean: float | None = None
    moe_expert_tokens_max: int | None = None


class DecisionRow(NamedTuple):
    """A row of the decisions table, every column in order (the last three optional, as above)."""

    step: int
    request_id: str
    event: str
    num_tokens: int
    phase: str | None
    num_computed_tokens: int | None
    prefix_hit_tokens: int
    blocks_gained: Sequence[int]
    blocks_freed: Sequence[int]
    finish_reason: str | None
    preempted_for: str | None = None  # whom a preemption served, with the blocks it needed and found free
    blocks_needed: int | None = None
    blocks_free: int | None = None


_STEP_V1 = StepRow._fields.index("admission_blocked")
_STEP_MOE = StepRow._fields.index("moe_experts_active_max")
_DECISION_V1 = DecisionRow._fields.index("preempted_for")
STEP_COLUMNS = StepRow._fields[:_STEP_V1]
ADMISSION_COLUMNS = StepRow._fields[_STEP_V1:_STEP_MOE]
MOE_COLUMNS = StepRow._fields[_STEP_MOE:]
REQUEST_COLUMNS = (
    "request_id", "arrival", "queued", "first_scheduled", "first_token", "finish", "num_prompt_tokens",
    "num_output_tokens", "num_cached_tokens", "num_preemptions", "finish_reason", "priority", "max_tokens", "error",
    "prompt_token_ids", "output_token_ids",
)
DECISION_COLUMNS = DecisionRow._fields[:_DECISION_V1]
BLOCK_EVENT_COLUMNS = ("step", "seq", "kind", "request_id", "block_ids", "hashes")
BLOCK_SNAPSHOT_COLUMNS = ("step", "block_id", "holders", "cached", "hash")

TABLES = {
    "steps": STEP_COLUMNS,
    "requests": REQUEST_COLUMNS,
    "decisions": DECISION_COLUMNS,
    "block_events": BLOCK_EVENT_COLUMNS,
    "block_snapshots": BLOCK_SNAPSHOT_COLUMNS,
}
# Columns added after version 1 first shipped: written by current recorders, absent from older traces
# (readers must not require them). Why admissions stopped in a step, whom each preemption served, and how
# a MoE model's step was routed.
OPTIONAL_COLUMNS = {"steps": StepRow._fields[_STEP_V1:], "decisions": DecisionRow._fields[_DECISION_V1:]}
# Decision events: a request scheduled for some tokens, preempted, finished (stop/length), aborted,
# rejected at admission.
DECISION_EVENTS = ("schedule", "preempt", "finish", "abort", "reject")


def stream_file(table: str) -> str:
    return f"{table}.jsonl"


def parquet_file(table: str) -> str:
    return f"{table}.parquet"


_FLOAT_COLUMNS = {"start", "end", "schedule_time", "execute_time", "sample_time", "arrival", "queued",
                  "first_scheduled", "first_token", "finish", "num_computed_tokens", "moe_experts_active_mean"}
_STR_COLUMNS = {"request_id", "event", "phase", "finish_reason", "kind", "error", "hash", "admission_blocked",
                "admission_blocked_request", "preempted_for"}
_INT_LIST_COLUMNS = {"blocks_gained", "blocks_freed", "block_ids", "prompt_token_ids", "output_token_ids"}
_STR_LIST_COLUMNS = {"hashes", "holders"}


def arrow_schema(table: str, extra_int_columns: tuple[str, ...] = ()) -> Any:
    """Column types of a table, stated up front so a long stream converts to Parquet batch by batch;
    `extra_int_columns` are integer columns a writer adds to every table (a cluster's `replica`)."""
    import pyarrow as pa

    def kind(c: str) -> Any:
        if c in _FLOAT_COLUMNS:
            return pa.float64()
        if c in _STR_COLUMNS:
            return pa.large_string()
        if c in _INT_LIST_COLUMNS:
            return pa.list_(pa.int64())
        if c in _STR_LIST_COLUMNS:
            return pa.list_(pa.large_string())
        return pa.bool_() if c == "cached" else pa.int64()

    columns = TABLES[table] + OPTIONAL_COLUMNS.get(table, ())
    return pa.schema([(c, kind(c)) for c in columns] + [(c, pa.int64()) for c in extra_int_columns])
