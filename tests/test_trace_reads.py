"""Readers check what they rely on: a trace whose tables repeat a step or request, or carry times that are
not finite, is read without those rows and says how many it dropped; a meta.json whose config is not an
object is refused in one line."""
import json

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


def _rewrite(trace, tmp_path, table, change):
    out = tmp_path / "damaged"
    out.mkdir()
    for f in trace.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
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
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in trace.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
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
