"""Readers check what they rely on: a trace whose tables repeat a step or request, or carry times that are
not finite, is read without those rows and says how many it dropped; a meta.json whose config is not an
object is refused in one line."""
import json
import shutil

import pandas as pd
import pytest

import traces
from sim.cli import main as sim_main
from traces.reader import TraceWarning
from traces.summary import summarize

WORKLOAD = "workloads/bursty.yaml"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("t") / "trace"
    assert sim_main(["replay", WORKLOAD, "--max-requests", "8", "--model", "qwen3-0.6b", "--hardware", "h100",
                     "--no-progress", "--trace", str(out)]) == 0
    return out


def _copy(trace, tmp_path):
    return shutil.copytree(trace, tmp_path / "damaged")


def _rewrite(trace, tmp_path, table, change):
    out = _copy(trace, tmp_path)
    df = pd.read_parquet(out / f"{table}.parquet")
    change(df).to_parquet(out / f"{table}.parquet", index=False)
    return out


def test_a_steps_table_with_every_row_twice_reads_as_one_row_per_step(trace, tmp_path):
    damaged = _rewrite(trace, tmp_path, "steps", lambda df: pd.concat([df, df]))
    with pytest.warns(TraceWarning, match=r"steps: dropped \d+ row\(s\) repeating a step"):
        t = traces.load(damaged)
    assert len(t.steps) == len(traces.load(trace).steps) and t.steps["step"].is_monotonic_increasing


def test_repeated_request_ids_are_dropped_and_the_summary_counts_each_request_once(trace, tmp_path):
    damaged = _rewrite(trace, tmp_path, "requests", lambda df: pd.concat([df, df.iloc[:3]]))
    with pytest.warns(TraceWarning, match=r"requests: dropped 3 row\(s\) repeating a request_id"):
        t = traces.load(damaged)
    assert summarize(t.requests)["requests"] == summarize(traces.load(trace).requests)["requests"]


def test_steps_whose_times_are_not_finite_are_dropped_and_counted(trace, tmp_path):
    def nan_start(df):
        df = df.copy()
        df.loc[df.index[:2], "start"] = float("nan")
        return df

    damaged = _rewrite(trace, tmp_path, "steps", nan_start)
    with pytest.warns(TraceWarning, match=r"steps: dropped 2 row\(s\) whose start is not finite"):
        t = traces.load(damaged)
    assert t.steps["start"].notna().all()


def test_a_meta_whose_config_is_not_an_object_is_one_line(trace, tmp_path, capsys):
    damaged = _copy(trace, tmp_path)
    meta = json.loads((damaged / "meta.json").read_text())
    (damaged / "meta.json").write_text(json.dumps({**meta, "config": [1, 2]}))
    capsys.readouterr()
    assert sim_main(["compare", str(trace), str(damaged)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config must be a JSON object" in err[0]


def test_the_tui_exits_non_zero_when_it_crashes(trace, monkeypatch):
    from tui import cli
    from tui.app import StepscopeApp

    def crash(self):
        raise RuntimeError("a view the trace breaks")

    run = StepscopeApp.run
    monkeypatch.setattr(StepscopeApp, "on_mount", crash)
    monkeypatch.setattr(StepscopeApp, "run", lambda self: run(self, headless=True))
    assert cli.main([str(trace)]) != 0


@pytest.mark.parametrize("name", ["steps.parquet", "steps.jsonl"])
def test_a_trace_file_that_is_a_link_to_an_endless_device_is_refused_in_one_line(trace, tmp_path, capsys, name):
    damaged = _copy(trace, tmp_path)
    (damaged / name).unlink(missing_ok=True)
    if name == "steps.jsonl":
        (damaged / "steps.parquet").unlink()
    (damaged / name).symlink_to("/dev/zero")
    from traces.__main__ import main

    capsys.readouterr()
    assert main(["export", str(damaged), "-o", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name}: not a regular file" in err[0]


def test_spans_that_are_a_link_to_an_endless_device_are_refused(trace, tmp_path):
    damaged = _copy(trace, tmp_path)
    (damaged / "spans.jsonl").symlink_to("/dev/zero")
    with pytest.raises(traces.TraceError, match="spans.jsonl: not a regular file"):
        _ = traces.load(damaged).spans


def test_a_first_row_without_a_newline_is_not_read_whole_to_find_one(tmp_path):
    from traces.streams import FIRST_ROW_BYTES, first_row_keys

    stream = tmp_path / "steps.jsonl"
    stream.write_bytes(b'{"step": ' + b"1" * (4 * FIRST_ROW_BYTES))
    assert first_row_keys(stream) is None


def _tui_refusal(trace, tmp_path, capsys, table, change) -> str:
    from tui import cli

    damaged = _rewrite(trace, tmp_path, table, change)
    capsys.readouterr()
    assert cli.main([str(damaged)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("table, column", [("steps", "num_running"), ("decisions", "num_tokens"),
                                           ("block_events", "block_ids"), ("block_snapshots", "holders")])
def test_the_tui_refuses_a_null_where_it_needs_a_value_naming_table_and_column(trace, tmp_path, capsys,
                                                                               table, column):
    def null(df):
        df[column] = None
        return df

    assert f"{table}.{column}: " in _tui_refusal(trace, tmp_path, capsys, table, null)


def test_the_tui_refuses_block_ids_outside_the_pool(trace, tmp_path, capsys):
    def far(df):
        df.loc[0, "block_id"] = 10**9
        return df

    assert "outside the pool" in _tui_refusal(trace, tmp_path, capsys, "block_snapshots", far)


def test_the_tui_shows_a_schedule_decision_whose_blocks_gained_is_null(trace, tmp_path):
    from tui.loader import open_trace
    from tui.model import RunIndex
    from tui.views import scheduled_rows

    def null(df):
        df["blocks_gained"] = None
        return df

    run = RunIndex(open_trace(_rewrite(trace, tmp_path, "decisions", null)))
    rows, _, _ = scheduled_rows(run, 0, None)
    assert rows and all(row[5] == "" for row in rows)
