"""Batched writers stream Arrow record batches; trace levels keep fewer tables. Both must leave traces
that every reader takes exactly as the JSON-lines ones."""
import pyarrow.parquet as pq
import pytest
from core_helpers import make_scheduler

import traces
from sim.cli import main
from traces.recorder import TraceRecorder
from traces.schema import TABLES
from traces.writer import TraceWriter
from workloads import DEFAULT_WORKLOAD
from trace_builders import prefix_and_short_requests, record_adding_every_other_step


def _record(path, flush_every=1, trace_level="full", num_steps=None, close=True):
    """A small run with prefix hits, preemptions and finishes; returns the recorder."""
    sched = make_scheduler(num_blocks=9, block_size=4, max_model_len=40)
    rec = TraceRecorder(TraceWriter(path, {"source": "sim"}, flush_every=flush_every), sched, snapshot_every=5,
                        trace_level=trace_level)
    for _ in record_adding_every_other_step(sched, rec, prefix_and_short_requests(), num_steps):
        pass
    if close:
        rec.close()
    return rec


def test_a_batched_writer_streams_arrow_and_compacts_to_the_same_tables_as_json_lines(tmp_path):
    _record(tmp_path / "jsonl", flush_every=1)
    rec = _record(tmp_path / "arrow", flush_every=4, close=False)
    assert rec.writer.stream_format == "arrow" and (tmp_path / "arrow" / "decisions.arrows").is_file()
    rec.close()
    for table in TABLES:
        a, b = pq.read_table(tmp_path / "jsonl" / f"{table}.parquet"), pq.read_table(tmp_path / "arrow" / f"{table}.parquet")
        assert a.num_rows == b.num_rows, table
        if a.num_rows:
            assert a.equals(b), table
    assert not list((tmp_path / "arrow").glob("*.arrows"))


def test_a_batched_run_not_yet_closed_loads_its_flushed_steps(tmp_path):
    rec = _record(tmp_path, flush_every=4, num_steps=10, close=False)
    t = traces.load(tmp_path)
    assert not t.complete and list(t.steps["step"]) == list(range(8))
    assert t.decisions["step"].max() == 7 and rec.num_steps == 10


def test_a_batched_run_killed_mid_batch_loads_up_to_its_last_whole_batch(tmp_path):
    _record(tmp_path, flush_every=4, num_steps=10, close=False)
    stream = tmp_path / "decisions.arrows"
    whole = stream.stat().st_size
    with open(stream, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x40\x01\x00\x00partial")  # a batch cut after its first bytes
    with pytest.warns(traces.TruncatedTraceWarning):
        t = traces.load(tmp_path)
    assert list(t.steps["step"]) == list(range(8)) and t.decisions["step"].max() == 7
    assert stream.stat().st_size > whole


def test_trace_level_steps_keeps_steps_and_requests_only(tmp_path):
    _record(tmp_path, flush_every=4, trace_level="steps")
    t = traces.load(tmp_path)
    assert t.meta["trace_level"] == "steps" and len(t.steps) > 0 and len(t.requests) == 6
    assert len(t.decisions) == 0 and len(t.block_events) == 0 and len(t.block_snapshots) == 0


def test_trace_level_none_keeps_requests_only(tmp_path):
    _record(tmp_path, flush_every=4, trace_level="none")
    t = traces.load(tmp_path)
    assert t.meta["trace_level"] == "none" and len(t.requests) == 6 and set(t.requests["finish_reason"]) == {"length"}
    assert len(t.steps) == 0 and len(t.decisions) == 0


def test_trace_levels_leave_request_metrics_unchanged(tmp_path):
    _record(tmp_path / "full", flush_every=4)
    _record(tmp_path / "none", flush_every=4, trace_level="none")
    full, none = traces.load(tmp_path / "full").requests, traces.load(tmp_path / "none").requests
    cols = ["request_id", "first_token", "finish", "num_output_tokens", "num_preemptions"]
    assert full[cols].equals(none[cols])


def test_an_unknown_trace_level_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--trace-level: must be one of full, steps, none"):
        _record(tmp_path, trace_level="decisions")


def test_sim_replay_bad_trace_level_is_one_line_exit_2(capsys):
    assert main(["replay", str(DEFAULT_WORKLOAD), "--trace-level", "some", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace-level" in err
