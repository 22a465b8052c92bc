"""Trace directory format, version 1: table names, their columns and file names (see FORMAT.md)."""
from __future__ import annotations

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPANS_FILE = "spans.jsonl"
# A Parquet file being compacted is `<table>.parquet.<pid>.tmp` until renamed; readers never look at it.
TEMP_SUFFIX = ".tmp"

STEP_COLUMNS = (
    "step", "start", "end", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens",
    "num_running", "num_waiting", "num_preempted", "kv_blocks_used", "kv_blocks_total", "prefix_hit_tokens",
    "num_new_reqs", "num_finished", "schedule_time", "execute_time", "sample_time",
)
REQUEST_COLUMNS = (
    "request_id", "arrival", "queued", "first_scheduled", "first_token", "finish", "num_prompt_tokens",
    "num_output_tokens", "num_cached_tokens", "num_preemptions", "finish_reason", "priority", "max_tokens", "error",
    "prompt_token_ids", "output_token_ids",
)
DECISION_COLUMNS = (
    "step", "request_id", "event", "num_tokens", "phase", "num_computed_tokens", "prefix_hit_tokens",
    "blocks_gained", "blocks_freed", "finish_reason",
)
BLOCK_EVENT_COLUMNS = ("step", "seq", "kind", "request_id", "block_ids", "hashes")
BLOCK_SNAPSHOT_COLUMNS = ("step", "block_id", "holders", "cached", "hash")

TABLES = {
    "steps": STEP_COLUMNS,
    "requests": REQUEST_COLUMNS,
    "decisions": DECISION_COLUMNS,
    "block_events": BLOCK_EVENT_COLUMNS,
    "block_snapshots": BLOCK_SNAPSHOT_COLUMNS,
}
# Decision events: a request scheduled for some tokens, preempted, finished (stop/length), aborted,
# rejected at admission.
DECISION_EVENTS = ("schedule", "preempt", "finish", "abort", "reject")


def stream_file(table: str) -> str:
    return f"{table}.jsonl"


def parquet_file(table: str) -> str:
    return f"{table}.parquet"


_FLOAT_COLUMNS = {"start", "end", "schedule_time", "execute_time", "sample_time", "arrival", "queued",
                  "first_scheduled", "first_token", "finish", "num_computed_tokens"}
_STR_COLUMNS = {"request_id", "event", "phase", "finish_reason", "kind", "error", "hash"}
_INT_LIST_COLUMNS = {"blocks_gained", "blocks_freed", "block_ids", "prompt_token_ids", "output_token_ids"}
_STR_LIST_COLUMNS = {"hashes", "holders"}


def arrow_schema(table: str, extra_int_columns: tuple[str, ...] = ()):
    """Column types of a table, stated up front so a long stream converts to Parquet batch by batch;
    `extra_int_columns` are integer columns a writer adds to every table (a cluster's `replica`)."""
    import pyarrow as pa

    def kind(c: str):
        if c in _FLOAT_COLUMNS:
            return pa.float64()
        if c in _STR_COLUMNS:
            return pa.large_string()
        if c in _INT_LIST_COLUMNS:
            return pa.list_(pa.int64())
        if c in _STR_LIST_COLUMNS:
            return pa.list_(pa.large_string())
        return pa.bool_() if c == "cached" else pa.int64()

    return pa.schema([(c, kind(c)) for c in TABLES[table]] + [(c, pa.int64()) for c in extra_int_columns])
