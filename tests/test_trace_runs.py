"""Row runs (traces.runs) write exactly the rows the plain per-row buffer writes: merged at their
positions among the buffered rows, with their constants and nulls, and a replay recorded through them
gives the same Parquet tables, to the byte of every value, as one recorded row by row."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.config import CacheConfig, SchedulerConfig
from sim.core.simulator import Simulator
from sim.core.sources import open_source
from traces.arrowstream import _token_lists
from traces.runs import GridSpec, RunSpec, merge_runs, runs_batch
from traces.writer import TraceWriter
from workloads import DEFAULT_WORKLOAD
from sim_helpers import FixedCost

SCHEMA = pa.schema([("step", pa.int64()), ("request_id", pa.large_string()), ("event", pa.large_string()),
                    ("blocks", pa.list_(pa.int64())), ("note", pa.large_string())])
SPEC = RunSpec(per_run=("step",), per_row=("request_id", "blocks"), constants={"event": "schedule"})


def _plain_rows(events):
    """The reference: every row as a dict, in recording order."""
    rows = []
    for kind, value in events:
        if kind == "row":
            rows.append(value)
        else:
            step, rids, blocks = value
            rows += [{"step": step, "request_id": r, "event": "schedule", "blocks": b, "note": None}
                     for r, b in zip(rids, blocks)]
    return rows


row = st.builds(lambda s, r, e, n: {"step": s, "request_id": r, "event": e, "blocks": [], "note": n},
                st.integers(0, 9), st.text(max_size=3), st.sampled_from(["finish", "preempt"]),
                st.none() | st.just("x"))
run = st.integers(0, 9).flatmap(lambda step: st.lists(st.tuples(st.text(max_size=3), st.lists(st.integers(0, 99),
                                                                                              max_size=3)),
                                                     min_size=1, max_size=4).map(
    lambda rs: (step, [r for r, _ in rs], [b for _, b in rs])))


@given(st.lists(st.one_of(st.tuples(st.just("row"), row), st.tuples(st.just("run"), run)), min_size=1))
def test_runs_merge_into_the_buffered_rows_at_their_positions(events):
    rows = [v for k, v in events if k == "row"]
    runs, n = [], 0
    for kind, value in events:
        if kind == "row":
            n += 1
        else:
            step, rids, blocks = value
            runs.append((n, len(rids), step, rids, blocks))
    buffered = pa.Table.from_pylist(rows, schema=SCHEMA).combine_chunks().to_batches()[0] if rows else None
    if not runs:
        return
    merged = merge_runs(buffered, runs_batch(SPEC, runs, SCHEMA), [r[0] for r in runs], [r[1] for r in runs])
    assert merged.to_pylist() == _plain_rows(events)




GRID_SCHEMA = pa.schema([("step", pa.int64()), ("request_id", pa.large_string()), ("computed", pa.float64()),
                         ("blocks", pa.list_(pa.int64())), ("event", pa.large_string()), ("note", pa.large_string())])
GRID = GridSpec(step="step", per_seat="request_id", counting="computed", sparse="blocks",
                constants={"event": "schedule"})
grid_run = st.tuples(st.integers(0, 99), st.integers(1, 5), st.integers(1, 4)).flatmap(
    lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.lists(st.text(max_size=3), min_size=t[2], max_size=t[2]),
                        st.lists(st.integers(0, 999), min_size=t[2], max_size=t[2]),
                        st.dictionaries(st.integers(0, t[1] * t[2] - 1), st.lists(st.integers(0, 99), max_size=3))))


@given(st.lists(grid_run, min_size=1, max_size=5))
def test_grid_runs_are_their_steps_by_seats_rows(grids):
    """Row j * n + i of a grid run: step first + j, seat i's value, seat i's count + j, its sparse list."""
    runs, expected = [], []
    for first, k, rids, counts, sparse in grids:
        n = len(rids)
        runs.append((0, n * k, first, n, rids, counts, dict(sorted(sparse.items()))))
        expected += [{"step": first + j, "request_id": rids[i], "computed": float(counts[i] + j),
                      "blocks": sparse.get(j * n + i, []), "event": "schedule", "note": None}
                     for j in range(k) for i in range(n)]
    assert GRID.batch(runs, GRID_SCHEMA).to_pylist() == expected


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_replay_through_runs_writes_the_row_by_row_trace(tmp_path, monkeypatch, async_scheduling):
    """A small pool (preemptions, resumes) and a flush every 7 steps, so runs and rows share flushes."""
    sched = SchedulerConfig(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256,
                            async_scheduling=async_scheduling)
    cache = CacheConfig(block_size=16, num_gpu_blocks=120)

    def replay(name):
        Simulator(sched, cache, FixedCost(), tmp_path / name, flush_every=7).run(
            open_source(str(DEFAULT_WORKLOAD), limit=40, time_scale=0.2).requests)
        return {t: pq.read_table(tmp_path / name / f"{t}.parquet")
                for t in ("steps", "decisions", "block_events", "block_snapshots", "requests")}

    with_runs = replay("runs")
    monkeypatch.setattr(TraceWriter, "run_buffer", lambda self, table, spec: None)
    row_by_row = replay("rows")
    events = with_runs["decisions"].column("event").to_pylist()
    assert "preempt" in events and events.count("schedule") > 100
    for table, expected in row_by_row.items():
        assert with_runs[table].equals(expected), table


@given(st.lists(st.none() | st.lists(st.integers(0, 2**40), max_size=40), max_size=30))
def test_token_id_columns_convert_to_the_arrays_pa_array_makes(rows):
    typ = pa.list_(pa.int64())
    assert _token_lists(rows, typ).equals(pa.array(rows, typ))
