"""Summaries read only the columns they need and walk the decisions a record batch at a time, from a
compacted trace, a crash-recovered one (JSON lines or Arrow streams, cut short) alike, and give the
figures a straightforward in-memory computation gives, so a long run's summary does not balloon."""
import math
import shutil
from collections import defaultdict

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trace_damage import to_streams

import traces
import traces.batches
from sim.cli import main as sim_main
from sim.report.summary import SUMMARY_READ, load_for_summary, sim_summary, write_plots
from sim.report.token_stats import TokenStats, TokenStream, stream_token_stats, token_times
from traces.schema import META_FILE, TABLES
from workloads import DEFAULT_WORKLOAD


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same small simulated trace, compacted and as JSON lines; few KV blocks and a small token
    budget, so it has chunked prefills and preemptions."""
    root = tmp_path_factory.mktemp("reads")
    assert sim_main(["replay", str(DEFAULT_WORKLOAD), "--cost-model", "roofline", "--model", "qwen3-0.6b",
                     "--hardware", "h100", "--max-requests", "30", "--trace", str(root / "pq"), "--no-progress",
                     "--num-gpu-blocks-override", "120", "--max-num-batched-tokens", "256"]) == 0
    shutil.copytree(root / "pq", root / "jsonl")
    to_streams(root / "jsonl")
    return root / "pq", root / "jsonl"


def _reference(decisions: pd.DataFrame, steps: pd.DataFrame) -> tuple[list[float], list[float]]:
    """(sorted ITLs, sorted token times) straight from the rules, request by request in Python: a token
    for every decode row, and for a prefill row followed by a decode or finishing in its step."""
    end = dict(zip(steps["step"].tolist(), steps["end"].tolist()))
    rows, finished = defaultdict(list), set()
    for step, rid, event, phase in decisions[["step", "request_id", "event", "phase"]].itertuples(index=False):
        if event == "schedule":
            rows[rid].append((step, phase))
        elif event == "finish":
            finished.add((rid, step))
    itl, times = [], []
    for rid, sched in rows.items():
        sched.sort(key=lambda r: r[0])
        tokens = []
        for i, (step, phase) in enumerate(sched):
            after = sched[i + 1][1] if i + 1 < len(sched) else None
            if phase == "decode" or after == "decode" or (after is None and (rid, step) in finished):
                tokens.append(end.get(step, math.nan))
        times += [t for t in tokens if t == t]
        itl += [b - a for a, b in zip(tokens, tokens[1:]) if b - a == b - a]
    return sorted(itl), sorted(times)


def _check(tokens: TokenStats, decisions: pd.DataFrame, steps: pd.DataFrame) -> None:
    itl, times = _reference(decisions, steps)
    assert len(itl) > 0 or len(decisions) < 20
    assert np.sort(tokens.itl).tolist() == itl
    assert np.repeat(tokens.times, tokens.counts).tolist() == times
    for bins in (1, 7, 50):
        a, b = tokens.histogram(bins), np.histogram(times, bins=bins)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def _same(a: dict, b: dict) -> bool:
    """Equal summaries: numbers within rounding (NaN for metrics without samples), the rest exactly."""
    numbers = {k: v for k, v in a.items() if isinstance(v, float | int)}
    return (a.keys() == b.keys() and numbers == pytest.approx({k: b[k] for k in numbers}, nan_ok=True)
            and all(a[k] == b[k] for k in a if k not in numbers))


@pytest.mark.parametrize("kind", [0, 1], ids=["parquet", "json-lines"])
def test_summary_load_reads_only_the_needed_columns(pair, kind):
    t = load_for_summary(pair[kind])
    for table in ("requests", "steps"):
        assert list(getattr(t, table).columns) == list(SUMMARY_READ[table])
    assert "prompt_token_ids" not in t.requests.columns and not hasattr(t, "decisions")
    assert isinstance(t.requests["request_id"].dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("kind", [0, 1], ids=["parquet", "json-lines"])
def test_streamed_tokens_match_the_rules_computed_row_by_row(pair, kind, monkeypatch):
    monkeypatch.setattr(traces.batches, "BATCH_ROWS", 7)  # prefills settled in a later batch than their row
    full = traces.load(pair[0])
    assert full.requests["num_preemptions"].sum() > 0 and (full.decisions["phase"] == "prefill").sum() > 30
    _check(load_for_summary(pair[kind]).tokens, full.decisions, full.steps)


def test_summary_from_the_light_load_equals_the_one_from_a_full_load(pair):
    assert _same(sim_summary(load_for_summary(pair[0])), sim_summary(traces.load(pair[0])))


def test_json_lines_and_parquet_give_the_same_summary(pair):
    assert _same(sim_summary(load_for_summary(pair[1])), sim_summary(load_for_summary(pair[0])))


def test_streamed_itl_percentiles_are_the_in_memory_ones_exactly(pair):
    """The figures the console prints come out bit for bit as from token_times over the whole table."""
    full = traces.load(pair[0])
    codes, times = token_times(full.decisions, full.steps)
    itl = np.diff(times)[codes[1:] == codes[:-1]]
    light = load_for_summary(pair[0])
    before = np.sort(light.tokens.itl)
    s = sim_summary(light)
    for q in (50, 90, 99):
        assert s[f"itl_p{q}_s"] == float(np.percentile(itl[~np.isnan(itl)], q))
    assert np.sort(light.tokens.itl).tolist() == before.tolist()  # reordered in place, nothing lost


def _cut_short(root, keep_steps: int, arrows: bool) -> None:
    """A run killed after `keep_steps` steps rows: the streams hold rows of later steps (written before
    their steps row), meta.json says incomplete; `arrows`: as the simulator streams, 50-row batches."""
    meta = orjson.loads((root / META_FILE).read_bytes())
    meta["complete"] = False
    (root / META_FILE).write_bytes(orjson.dumps(meta))
    for table in TABLES:
        tbl = pq.read_table(root / f"{table}.parquet")
        if table == "steps":
            tbl = tbl.slice(0, keep_steps)
        (root / f"{table}.parquet").unlink()
        if arrows:
            with pa.ipc.new_stream(root / f"{table}.arrows", tbl.schema) as out:
                for batch in tbl.to_batches(max_chunksize=50):
                    out.write_batch(batch)
        else:
            (root / f"{table}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in tbl.to_pylist()))


@pytest.mark.parametrize("arrows", [False, True], ids=["json-lines", "arrow-stream"])
def test_a_trace_cut_short_streams_up_to_its_last_step(pair, tmp_path, arrows):
    shutil.copytree(pair[0], tmp_path / "t")
    keep = len(pq.read_table(pair[0] / "steps.parquet")) // 2
    _cut_short(tmp_path / "t", keep, arrows)
    full = traces.load(tmp_path / "t")
    assert full.decisions["step"].max() == keep - 1
    light = load_for_summary(tmp_path / "t")
    _check(light.tokens, full.decisions, full.steps)
    assert _same(sim_summary(light), sim_summary(full))


def test_decisions_out_of_step_order_are_sorted_in_memory(pair, tmp_path):
    shutil.copytree(pair[0], tmp_path / "t")
    path = tmp_path / "t" / "decisions.parquet"
    tbl = pq.read_table(path)
    pq.write_table(tbl.take(np.random.default_rng(0).permutation(tbl.num_rows)), path)
    full = traces.load(pair[0])
    _check(load_for_summary(tmp_path / "t").tokens, full.decisions, full.steps)


ROWS = [(0, "a", "schedule", "prefill"), (1, "a", "schedule", "prefill"), (2, "a", "schedule", "decode"),
        (3, "a", "schedule", "decode"), (3, "a", "finish", None),
        (0, "b", "schedule", "prefill"), (1, "b", "schedule", "decode"), (2, "b", "preempt", None),
        (3, "b", "schedule", "prefill"), (4, "b", "schedule", "decode"), (4, "b", "finish", None),
        (2, "c", "schedule", "prefill"), (2, "c", "finish", None),  # one output token: out in its prefill step
        (3, "d", "schedule", "prefill"), (5, "d", "schedule", "decode"),  # step 5 never recorded: no time
        (6, "d", "schedule", "decode"), (7, "e", "schedule", "prefill")]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 100])
def test_the_stream_settles_prefills_across_any_batch_boundary(chunk):
    decisions = pd.DataFrame(ROWS, columns=["step", "request_id", "event", "phase"]).sort_values("step", kind="stable")
    steps = pd.DataFrame({"step": [0, 1, 2, 3, 4, 6, 7], "end": [1.0, 2.0, 3.0, 4.0, 6.0, 9.0, 11.0]})
    tbl = pa.Table.from_pandas(decisions, preserve_index=False)
    tokens = stream_token_stats(tbl.to_batches(max_chunksize=chunk), steps, None, ["a", "b"])
    _check(tokens, decisions, steps)
    assert np.sort(tokens.itl).tolist() == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_the_stream_refuses_rows_that_go_back_in_step():
    stream = TokenStream(pd.DataFrame({"step": [0, 1], "end": [1.0, 2.0]}))
    one = np.ones(1, dtype=bool)
    assert stream.add(np.array([0]), np.array([1]), one, ~one, one)
    assert not stream.add(np.array([0]), np.array([0]), one, ~one, one)


def test_plots_from_the_streamed_load(pair, tmp_path):
    paths = write_plots(load_for_summary(pair[0]), tmp_path)
    assert {p.name for p in paths} == {"latency_cdf.png", "throughput.png", "queues.png", "kv_usage.png"}
