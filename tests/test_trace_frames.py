"""`traces.load` keeps a long trace's frames near the size of its data (list columns' empty rows share one
array, a cut-short trace is clipped in Arrow, streams are not left memory-mapped), and gives exactly the
frames that converting each whole table with `to_pandas` and clipping it in pandas gives."""
import shutil

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import traces
from sim.cli import main as sim_main
from traces.frames import arrow_to_frame, clip_rows, list_objects
from traces.schema import META_FILE, TABLES
from workloads import DEFAULT_WORKLOAD

LISTS = pa.table({
    "step": pa.array([0, 1, 1, 2, 3], pa.int64()),
    "ids": pa.chunked_array([pa.array([[1, 2], [], None], pa.list_(pa.int64())),
                             pa.array([[], [7]], pa.list_(pa.int64()))]),
    "hashes": pa.array([["a"], [], [], None, ["b", "c"]], pa.list_(pa.large_string())),
    "name": pa.array(["x", "y", None, "z", "w"], pa.large_string()),
})


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Per-row arrays as tuples, so frames compare by value."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = [tuple(v.tolist()) if isinstance(v, np.ndarray) else v for v in out[c]]
    return out


def _assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns) and got.dtypes.equals(want.dtypes)
    pd.testing.assert_frame_equal(_plain(got), _plain(want))
    for c in want.columns[want.dtypes == object]:
        for g, w in zip(got[c], want[c]):
            assert type(g) is type(w) and (not isinstance(w, np.ndarray) or g.dtype == w.dtype)


def test_list_columns_convert_as_to_pandas_makes_them_with_one_shared_empty_array():
    got = arrow_to_frame(LISTS)
    _assert_same_frame(got, LISTS.to_pandas())
    empties = [v for c in ("ids", "hashes") for v in got[c] if v is not None and not len(v)]
    assert len(empties) == 4 and len({id(v) for v in got["ids"] if v is not None and not len(v)}) == 1
    assert not any(v.flags.writeable for v in empties)


def test_a_list_column_without_empty_rows_is_to_pandas_own_views():
    arr = pa.chunked_array([pa.array([[1], [2, 3]], pa.list_(pa.int64()))])
    assert [v.tolist() for v in list_objects(arr)] == [[1], [2, 3]]


@pytest.mark.parametrize("steps", [[0, 1, 1, 2, 3], [0, 3, 1, 2, 1]], ids=["in-step-order", "out-of-order"])
def test_rows_of_steps_after_the_last_are_dropped_wherever_they_lie(steps):
    tbl = LISTS.set_column(0, "step", pa.array(steps, pa.int64()))
    want = tbl.to_pandas()
    _assert_same_frame(arrow_to_frame(clip_rows(tbl, 1)), want[want["step"] <= 1].reset_index(drop=True))
    assert clip_rows(tbl, 3) is tbl and clip_rows(tbl, None) is tbl


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    """A small simulated trace with chunked prefills and preemptions (block events, freed blocks)."""
    root = tmp_path_factory.mktemp("frames") / "pq"
    assert sim_main(["replay", str(DEFAULT_WORKLOAD), "--cost-model", "roofline", "--model", "qwen3-0.6b",
                     "--hardware", "h100", "--max-requests", "30", "--trace", str(root), "--no-progress",
                     "--num-gpu-blocks-override", "120", "--max-num-batched-tokens", "256"]) == 0
    return root


def _cut_short(src, dst, keep_steps: int, form: str) -> None:
    """`src` as a run killed after `keep_steps` steps rows leaves it: streams only (`form`: Parquet kept,
    Arrow stream of 50-row batches, or JSON lines), later steps' rows still in them, meta incomplete."""
    shutil.copytree(src, dst)
    meta = orjson.loads((dst / META_FILE).read_bytes())
    (dst / META_FILE).write_bytes(orjson.dumps({**meta, "complete": False}))
    for table in TABLES:
        tbl = pq.read_table(dst / f"{table}.parquet")
        if table == "steps":
            tbl = tbl.slice(0, keep_steps)
        if form == "parquet":
            pq.write_table(tbl, dst / f"{table}.parquet")
            continue
        (dst / f"{table}.parquet").unlink()
        if form == "arrows":
            with pa.ipc.new_stream(dst / f"{table}.arrows", tbl.schema) as out:
                for batch in tbl.to_batches(max_chunksize=50):
                    out.write_batch(batch)
        else:
            (dst / f"{table}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in tbl.to_pylist()))


@pytest.mark.parametrize("form", ["parquet", "arrows", "jsonl"])
def test_a_cut_short_trace_loads_as_whole_tables_converted_and_clipped_in_pandas(compacted, tmp_path, form):
    keep = len(pq.read_table(compacted / "steps.parquet")) // 2
    _cut_short(compacted, tmp_path / "t", keep, form)
    got = traces.load(tmp_path / "t")
    for table in TABLES:
        want = pq.read_table(compacted / f"{table}.parquet").to_pandas()
        if table == "steps":
            want = want.iloc[:keep]
        elif "step" in want.columns:
            want = want[want["step"] <= keep - 1].reset_index(drop=True)
        _assert_same_frame(getattr(got, table), want)
    assert got.decisions["step"].max() == keep - 1


@pytest.mark.parametrize("form", ["parquet", "arrows", "jsonl"])
def test_a_cut_short_trace_read_without_its_steps_is_clipped_all_the_same(compacted, tmp_path, form):
    keep = len(pq.read_table(compacted / "steps.parquet")) // 2
    _cut_short(compacted, tmp_path / "t", keep, form)
    whole = traces.load(tmp_path / "t")
    alone = traces.load(tmp_path / "t", tables=("decisions",))
    no_step = traces.load(tmp_path / "t", columns={"steps": ("end",)}, tables=("steps", "block_events"))
    assert len(alone.steps) == 0 and len(whole.decisions) > 0
    _assert_same_frame(alone.decisions, whole.decisions)
    _assert_same_frame(no_step.block_events, whole.block_events)


@pytest.mark.parametrize("form", ["compacted", "arrows", "jsonl"])
def test_the_summary_columns_alone_give_the_summary_of_the_whole_trace(compacted, tmp_path, form):
    """engine run and sim replay --samples summarise from SUMMARY_COLUMNS, not the decisions."""
    from traces.summary import SUMMARY_COLUMNS, summarize

    path = compacted
    if form != "compacted":
        path = tmp_path / "t"
        _cut_short(compacted, path, len(pq.read_table(compacted / "steps.parquet")) // 2, form)
    whole, light = traces.load(path), traces.load(path, columns=SUMMARY_COLUMNS, tables=SUMMARY_COLUMNS)
    assert len(light.decisions) == 0 and len(whole.decisions) > 0
    a, b = summarize(light.requests, light.steps), summarize(whole.requests, whole.steps)
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)
