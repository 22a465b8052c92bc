"""The trace directory: write -> load round trips, cut-short traces, block-pool reconstruction."""
import json
import random
import time
import warnings

import pytest
from core_helpers import fake_output, make_requests, make_scheduler
from trace_compare import as_lists

import traces
from engine.core import RequestStatus
from traces.blocks import BlockPoolIndex
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from recording import record_step
from trace_builders import prefix_and_short_requests, record_adding_every_other_step


def _record(tmp_path, num_steps=None, snapshot_every=7, close=True, write_behind=False, **sched_kw):
    """Drive the real scheduler with a fake runner through a TraceRecorder; return live snapshots."""
    sched = make_scheduler(**{"num_blocks": 12, "block_size": 4, "max_model_len": 40, **sched_kw})
    rec = TraceRecorder(TraceWriter(tmp_path, {"source": "sim"}, write_behind=write_behind), sched,
                        snapshot_every=snapshot_every)
    live = {}
    for step in record_adding_every_other_step(sched, rec, prefix_and_short_requests(), num_steps):
        live[step] = rec.block_snapshot(step)
    if close:
        rec.close()
    return live, rec


def test_written_trace_loads_back_with_every_table(tmp_path):
    _record(tmp_path)
    t = traces.load(tmp_path)
    assert t.complete and t.meta["format_version"] == traces.FORMAT_VERSION and t.source == "sim"
    assert len(t.requests) == 6 and set(t.requests["finish_reason"]) == {"length"}
    assert list(t.steps["step"]) == list(range(len(t.steps)))
    assert {"schedule", "finish"} <= set(t.decisions["event"])
    assert (tmp_path / "steps.parquet").exists() and not (tmp_path / "steps.jsonl").exists()


def test_decisions_account_for_every_scheduled_token(tmp_path):
    _record(tmp_path)
    t = traces.load(tmp_path)
    sched = t.decisions[t.decisions["event"] == "schedule"].groupby("step")["num_tokens"].sum()
    assert sched.to_dict() == t.steps.set_index("step")["num_scheduled_tokens"][lambda s: s > 0].to_dict()


def test_prompt_and_output_token_ids_are_recorded(tmp_path):
    _record(tmp_path)
    r = traces.load(tmp_path).requests.set_index("request_id").loc["r0"]
    assert list(r["prompt_token_ids"])[:8] == list(range(500, 508))
    assert list(r["output_token_ids"]) == [7] * 12


def test_preemptions_are_recorded_with_freed_blocks(tmp_path):
    _record(tmp_path, num_blocks=9, enable_prefix_caching=False)
    t = traces.load(tmp_path)
    pre = t.decisions[t.decisions["event"] == "preempt"]
    assert len(pre) > 0 and all(len(b) > 0 for b in pre["blocks_freed"])
    assert t.requests["num_preemptions"].sum() == len(pre)


@pytest.mark.parametrize("snapshot_every", [1, 5, 1000])
def test_block_pool_rebuilt_from_the_trace_equals_the_live_pool(tmp_path, snapshot_every):
    live, _ = _record(tmp_path, snapshot_every=snapshot_every, num_blocks=10)
    t = traces.load(tmp_path)
    index = BlockPoolIndex.from_trace(t)
    for step, rows in live.items():
        rebuilt = {b.block_id: (b.holders, b.cached, b.hash) for b in index.state_at(step)
                   if b.holders or b.cached}
        expected = {r["block_id"]: (r["holders"], r["cached"], r["hash"]) for r in rows}
        assert rebuilt == expected, f"step {step}"


@pytest.mark.parametrize("order", ["backwards", "shuffled"])
def test_block_pool_rebuilt_in_any_step_order_from_arrow_columns_equals_the_live_pool(tmp_path, order):
    """The TUI jumps back and forth over a trace read with Arrow lists and dictionary-coded strings."""
    live, _ = _record(tmp_path, snapshot_every=9, num_blocks=10)
    t = traces.load(tmp_path, arrow_lists=True, categories=("request_id", "kind"))
    index = BlockPoolIndex.from_trace(t)
    steps = sorted(live)[::-1] if order == "backwards" else random.Random(0).sample(sorted(live), len(live))
    for step in steps:
        rebuilt = {b.block_id: (b.holders, b.cached, b.hash) for b in index.state_at(step)
                   if b.holders or b.cached}
        expected = {r["block_id"]: (r["holders"], r["cached"], r["hash"]) for r in live[step]}
        assert rebuilt == expected, f"step {step}"


def test_shared_prefix_blocks_show_two_holders(tmp_path):
    live, _ = _record(tmp_path)
    assert any(len(r["holders"]) > 1 for rows in live.values() for r in rows)


def test_a_write_behind_writer_leaves_the_same_trace_as_a_synchronous_one(tmp_path):
    """The engine's writer thread writes what each step handed it, in order, by the time close returns."""
    _record(tmp_path / "sync")
    _record(tmp_path / "behind", write_behind=True)
    a, b = traces.load(tmp_path / "sync"), traces.load(tmp_path / "behind")
    assert b.complete and len(b.steps) > 20
    for table in ("steps", "requests", "decisions", "block_events", "block_snapshots"):
        assert as_lists(getattr(a, table)).equals(as_lists(getattr(b, table))), table

def test_a_write_behind_writer_hands_rows_over_at_most_once_per_handoff_interval(tmp_path, monkeypatch):
    """Flushes within HANDOFF_S of the last hand-off keep their rows; close hands over the rest."""
    monkeypatch.setattr(TraceWriter, "HANDOFF_S", 3600.0)
    writer = TraceWriter(tmp_path, {"source": "sim"}, write_behind=True)
    lines = lambda: (tmp_path / "steps.jsonl").read_text().splitlines()  # noqa: E731
    for step in range(5):
        writer.write_rows("steps", [{"step": step}])
        writer.flush()
    deadline = time.monotonic() + 10
    while not lines() and time.monotonic() < deadline:  # the first flush's hand-off, written by the thread
        time.sleep(0.01)
    time.sleep(0.2)
    assert [json.loads(line)["step"] for line in lines()] == [0]
    writer.close(compact=False)
    assert [json.loads(line)["step"] for line in lines()] == [0, 1, 2, 3, 4]


def test_a_trace_cut_short_loads_up_to_its_last_step(tmp_path):
    live, rec = _record(tmp_path, num_steps=9, close=False)
    rec.writer.flush()
    with open(tmp_path / "steps.jsonl", "a") as f:
        f.write('{"step": 9, "start": 9.0, "en')  # a write cut mid-line
    with open(tmp_path / "decisions.jsonl", "a") as f:
        f.write(json.dumps({"step": 9, "request_id": "r0", "event": "schedule"}) + "\n")
    with pytest.warns(traces.TruncatedTraceWarning):
        t = traces.load(tmp_path)
    assert not t.complete
    assert list(t.steps["step"]) == list(range(9))
    assert t.decisions["step"].max() == 8


def test_a_directory_that_is_not_a_trace_is_refused_clearly(tmp_path):
    with pytest.raises(traces.TraceError, match="no meta.json"):
        traces.load(tmp_path)
    with pytest.raises(traces.TraceError, match="not a directory"):
        traces.load(tmp_path / "missing")


def test_another_format_version_is_refused(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(traces.TraceError, match="format_version is 99"):
        traces.load(tmp_path)


def test_aborts_are_recorded_as_decisions_and_requests(tmp_path):
    sched = make_scheduler()
    rec = TraceRecorder(TraceWriter(tmp_path, {"source": "sim"}), sched)
    a, b = make_requests(2, max_tokens=5)
    for r in (a, b):
        sched.add_request(r)
        rec.on_add(r)
    out = sched.schedule()
    record_step(rec, out, sched.update_from_output(out, fake_output(out, sched)), 0.0, 1.0)
    rec.on_abort(sched.finish_requests([b.request_id], RequestStatus.FINISHED_ABORTED))
    out = sched.schedule()
    record_step(rec, out, sched.update_from_output(out, fake_output(out, sched)), 1.0, 2.0)
    rec.close()
    t = traces.load(tmp_path)
    ab = t.decisions[t.decisions["event"] == "abort"]
    assert list(ab["request_id"]) == ["r1"] and list(ab["step"]) == [1] and len(ab["blocks_freed"].iloc[0]) == 1
    reasons = t.requests.set_index("request_id")["finish_reason"]
    assert reasons["r1"] == "abort" and reasons.isna()["r0"]  # r0 was still running at the end


def test_rejected_requests_are_recorded(tmp_path):
    sched = make_scheduler(max_model_len=16)
    rec = TraceRecorder(TraceWriter(tmp_path, {"source": "sim"}), sched)
    bad, = make_requests(1, num_tokens=20)
    sched.add_request(bad)
    rec.on_add(bad)
    out = sched.schedule()
    record_step(rec, out, sched.update_from_output(out, fake_output(out, sched)), 0.0, 1.0)
    rec.close()
    t = traces.load(tmp_path)
    assert t.requests.iloc[0]["finish_reason"] == "error" and "max_model_len" in t.requests.iloc[0]["error"]
    assert list(t.decisions["event"]) == ["reject"]


def test_loading_needs_no_warning_for_a_complete_trace(tmp_path):
    _record(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traces.load(tmp_path)
