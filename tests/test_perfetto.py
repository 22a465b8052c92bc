"""Chrome/Perfetto trace JSON export and the `python -m traces` command, on small recorded traces."""
import json
import math
import subprocess
import sys
from collections import defaultdict

import pytest
from core_helpers import fake_output, make_requests, make_scheduler

import traces
from traces.__main__ import main
from traces.perfetto import DECODE_TID, MIXED_TID, PREEMPT_TID, PREFILL_TID, STEPS_TID, export_perfetto, to_perfetto
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from recording import record_step

PHASE_NAMES = {"schedule", "execute", "sample"}


def _record(path, source, num_steps=None, **sched_kw):
    """The real scheduler and a fake runner through a TraceRecorder, on a made-up clock (1 s per step)."""
    sched = make_scheduler(**{"num_blocks": 9, "block_size": 4, "max_model_len": 40,
                              "enable_prefix_caching": False, **sched_kw})
    now = [0.0]
    sched.clock = lambda: now[0]
    rec = TraceRecorder(TraceWriter(path, {"source": source}), sched)
    reqs = make_requests(4, num_tokens=14, max_tokens=10, ignore_eos=True) + make_requests(
        2, num_tokens=5, max_tokens=6, ignore_eos=True, start=4)
    step = 0
    while sched.has_unfinished_requests() or reqs:
        now[0] = float(step)
        if reqs and step % 2 == 0:
            req = reqs.pop(0)
            req.arrival_time = step - 0.5
            sched.add_request(req)
            rec.on_add(req)
        out = sched.schedule()
        now[0] = step + 0.9
        outputs = sched.update_from_output(out, fake_output(out, sched))
        record_step(rec, out, outputs, float(step), step + 0.9, schedule_time=0.1, execute_time=0.6, sample_time=0.1)
        step += 1
        if step == num_steps:
            break
    rec.close()
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("perfetto")
    return {"engine": _record(root / "run_a", "engine"), "sim": _record(root / "run_b", "sim"),
            "cut": _record(root / "cut", "sim", num_steps=8)}


@pytest.fixture(scope="module")
def doc(dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "trace.json"
    export_perfetto([dirs["engine"], dirs["sim"]], out)
    return json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def _ns(us: float) -> int:
    return round(us * 1000)


def _events(doc, ph, pid=None):
    return [e for e in doc["traceEvents"] if e["ph"] == ph and (pid is None or e["pid"] == pid)]


def test_written_file_is_strict_json_with_the_trace_event_envelope(doc):
    assert doc["displayTimeUnit"] == "ms" and len(doc["traceEvents"]) > 0
    json.dumps(doc, allow_nan=False)


def test_each_step_is_one_slice_on_the_steps_thread_and_one_on_its_composition_thread(doc, dirs):
    steps = traces.load(dirs["engine"]).steps
    slices = [e for e in _events(doc, "X", pid=1) if e["name"].startswith("step ")]
    on_steps = [e for e in slices if e["tid"] == STEPS_TID]
    assert len(on_steps) == len(steps)
    expected = {PREFILL_TID: ((steps.num_prefill_tokens > 0) & (steps.num_decode_tokens == 0)).sum(),
                DECODE_TID: ((steps.num_prefill_tokens == 0) & (steps.num_decode_tokens > 0)).sum(),
                MIXED_TID: ((steps.num_prefill_tokens > 0) & (steps.num_decode_tokens > 0)).sum()}
    assert {tid: sum(e["tid"] == tid for e in slices) for tid in expected} == expected
    assert expected[MIXED_TID] > 0 and expected[DECODE_TID] > 0
    first = on_steps[0]
    assert first["ts"] == 0.0 and first["dur"] == pytest.approx(0.9e6)
    assert first["args"]["tokens"] == steps.num_scheduled_tokens[0]


def test_phase_slices_nest_inside_their_step_on_the_same_thread(doc):
    for pid in (1, 2):
        xs = _events(doc, "X", pid=pid)
        steps = [e for e in xs if e["name"].startswith("step ") and e["tid"] == STEPS_TID]
        phases = [e for e in xs if e["name"] in PHASE_NAMES]
        assert len(phases) == 3 * len(steps)
        for p in phases:
            lo, hi = _ns(p["ts"]), _ns(p["ts"]) + _ns(p["dur"])
            parents = [s for s in steps if s["tid"] == p["tid"] and _ns(s["ts"]) <= lo
                       and hi <= _ns(s["ts"]) + _ns(s["dur"])]
            assert len(parents) == 1, p


def test_two_traces_are_two_processes_named_after_directory_and_source(doc):
    names = {e["pid"]: e["args"]["name"] for e in _events(doc, "M") if e["name"] == "process_name"}
    assert names == {1: "run_a (engine)", 2: "run_b (sim)"}
    assert {e["pid"] for e in doc["traceEvents"]} == {1, 2}


def test_counters_carry_kv_usage_queue_lengths_and_scheduled_tokens(doc, dirs):
    steps = traces.load(dirs["engine"]).steps
    counters = defaultdict(list)
    for e in _events(doc, "C", pid=1):
        counters[e["name"]].append(e)
    assert {"KV cache blocks", "KV cache usage %", "queue", "tokens scheduled"} <= set(counters)
    kv = counters["KV cache blocks"]
    assert [c["args"]["used"] for c in kv] == list(steps.kv_blocks_used)
    pct = counters["KV cache usage %"][0]["args"]["percent"]
    assert pct == pytest.approx(100 * steps.kv_blocks_used[0] / steps.kv_blocks_total[0])
    assert [c["args"]["waiting"] for c in counters["queue"]] == list(steps.num_waiting)


def test_request_async_slices_pair_up_by_id_and_nest(doc, dirs):
    stacks, roots = defaultdict(list), defaultdict(int)
    for e in doc["traceEvents"]:
        if e["ph"] not in "be":
            continue
        assert e["cat"] == "request"
        key = (e["pid"], e["id2"]["local"])
        if e["ph"] == "b":
            roots[key] += e["name"] == "request"
            stacks[key].append((e["name"], _ns(e["ts"])))
        else:
            name, start = stacks[key].pop()
            assert name == e["name"] and _ns(e["ts"]) >= start
    assert all(not s for s in stacks.values())
    assert sum(k[0] == 1 for k in roots) == len(traces.load(dirs["engine"]).requests)
    assert set(roots.values()) == {1}


def test_request_phases_follow_the_requests_table(doc, dirs):
    r = traces.load(dirs["engine"]).requests.set_index("request_id").loc["r0"]
    seq = [(e["ph"], e["name"], e["ts"]) for e in _events(doc, "b", 1) + _events(doc, "e", 1)
           if e["id2"]["local"] == "r0"]
    assert ("b", "queued", r.arrival * 1e6) in seq and ("e", "queued", r.first_scheduled * 1e6) in seq
    assert ("b", "decode", r.first_token * 1e6) in seq and ("e", "request", r.finish * 1e6) in seq


def test_preemptions_become_instant_events(doc, dirs):
    d = traces.load(dirs["engine"]).decisions
    instants = _events(doc, "i", pid=1)
    assert len(instants) == (d.event == "preempt").sum() > 0
    assert all(e["tid"] == PREEMPT_TID and e["name"].startswith("preempt ") for e in instants)


def test_unfinished_requests_end_at_the_last_step_they_were_in(dirs):
    t = traces.load(dirs["cut"])
    open_ = t.requests[t.requests.finish.isna()]
    assert len(open_) > 0
    doc = to_perfetto([t])
    ends = {e["id2"]["local"]: e["ts"] for e in _events(doc, "e") if e["name"] == "request"}
    step_end = t.steps.set_index("step")["end"]
    seen = {rid: step_end[s] for rid, s in t.decisions.groupby("request_id").step.max().items()}
    assert any(rid in seen for rid in open_.request_id)
    for rid, row in open_.set_index("request_id").iterrows():
        known = row[["arrival", "queued", "first_scheduled", "first_token"]].max()
        assert ends[rid] == pytest.approx(max(seen.get(rid, known), known) * 1e6)


def test_missing_values_are_dropped_rather_than_written_as_nan(dirs):
    t = traces.load(dirs["engine"])
    t.steps.loc[0, "execute_time"] = math.nan
    t.steps.loc[1, "kv_blocks_total"] = math.nan
    t.requests.loc[0, "first_token"] = math.nan
    text = json.dumps(to_perfetto([t]), allow_nan=False)
    doc = json.loads(text)
    step0 = [e["name"] for e in _events(doc, "X") if e["ts"] < 0.9e6 and e["tid"] == STEPS_TID]
    assert step0 == ["step 0", "schedule"]
    kv1 = [e for e in _events(doc, "C") if e["ts"] == 1e6 and e["name"].startswith("KV")]
    assert [(e["name"], e["args"]) for e in kv1] == [("KV cache blocks", {"used": t.steps.kv_blocks_used[1]})]


def test_cli_export_writes_the_file_and_exits_zero(dirs, tmp_path):
    out = tmp_path / "both.json"
    res = subprocess.run([sys.executable, "-m", "traces", "export", str(dirs["engine"]), str(dirs["sim"]),
                          "-o", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert {e["pid"] for e in json.loads(out.read_text())["traceEvents"]} == {1, 2}


def test_cli_refuses_a_directory_that_is_not_a_trace_with_one_line(tmp_path, capsys):
    (tmp_path / "not_a_trace").mkdir()
    assert main(["export", str(tmp_path / "not_a_trace"), "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "not_a_trace") in err and "meta.json" in err
    assert not (tmp_path / "x.json").exists()


def test_cli_reports_an_unwritable_output_with_one_line(dirs, tmp_path, capsys):
    out = tmp_path / "missing" / "x.json"
    assert main(["export", str(dirs["sim"]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err


def test_cli_summary_prints_the_run_summary(dirs, capsys):
    assert main(["summary", str(dirs["sim"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("requests: 6 finished of 6") and "preemptions:" in out


def test_the_streamed_export_holds_the_same_events_as_the_document_in_memory(dirs, doc):
    expected = to_perfetto([traces.load(dirs["engine"]), traces.load(dirs["sim"])])
    assert doc == json.loads(json.dumps(expected))


def test_an_export_that_fails_midway_leaves_no_file_and_keeps_an_old_one(dirs, tmp_path):
    out = tmp_path / "trace.json"
    out.write_text("the user's earlier export")
    with pytest.raises(traces.TraceError):
        export_perfetto([dirs["engine"], tmp_path / "not-a-trace"], out)
    assert out.read_text() == "the user's earlier export"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]
