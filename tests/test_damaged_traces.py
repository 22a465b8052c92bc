"""Every reader entry point (`python -m traces summary|export`, `sim replay|compare|calibrate`, `tui`) ends a
damaged trace with one line naming the file and the problem and exit status 2, never a traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from trace_damage import DAMAGES, cut_in_half, garbage, to_streams, zero_bytes

import traces
from sim.cli import main as sim_main
from traces.__main__ import main as traces_main
from tui.cli import main as tui_main

ROOT = Path(__file__).resolve().parent.parent
BURSTY = str(ROOT / "workloads" / "bursty.yaml")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A small real trace, written by the simulator."""
    path = tmp_path_factory.mktemp("good") / "trace"
    rc = sim_main(["replay", BURSTY, "--cost-model", "roofline", "--model", "qwen3-0.6b", "--hardware", "h100",
                   "--max-requests", "20", "--trace", str(path), "--no-progress"])
    assert rc == 0
    return path


@pytest.fixture
def copy(good, tmp_path) -> Path:
    path = tmp_path / "damaged"
    shutil.copytree(good, path)
    return path


ENTRY_POINTS = {
    "traces summary": lambda d, good, tmp: traces_main(["summary", str(d)]),
    "traces export": lambda d, good, tmp: traces_main(["export", str(d), "-o", str(tmp / "out.json")]),
    "sim replay": lambda d, good, tmp: sim_main(["replay", str(d), "--no-progress", "--trace", str(tmp / "replay")]),
    "sim compare": lambda d, good, tmp: sim_main(["compare", str(good), str(d)]),
    "sim calibrate": lambda d, good, tmp: sim_main(["calibrate", str(d), "-o", str(tmp / "p.json")]),
    "tui": lambda d, good, tmp: tui_main([str(d)]),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_damaged_trace_is_one_line_naming_the_file_and_exit_2(entry, damage, copy, good, tmp_path, capsys):
    harm, filename = DAMAGES[damage]
    harm(copy)
    capsys.readouterr()
    assert ENTRY_POINTS[entry](copy, good, tmp_path) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and filename in err and "Traceback" not in err, err


@pytest.mark.parametrize("harm", [garbage, zero_bytes, cut_in_half], ids=["garbage", "0-byte", "truncated"])
def test_unreadable_parquet_gives_way_to_its_json_lines(harm, copy, good):
    to_streams(copy)
    pq.write_table(pq.read_table(good / "requests.parquet"), copy / "requests.parquet")
    harm(copy / "requests.parquet")
    with pytest.warns(traces.TraceWarning, match="requests.parquet: unreadable Parquet"):
        t = traces.load(copy)
    pd.testing.assert_series_equal(t.requests["request_id"], traces.load(good).requests["request_id"])


def test_crash_recovered_trace_loads_the_same_tables_as_the_compacted_one(copy, good):
    to_streams(copy)
    a, b = traces.load(good), traces.load(copy)
    for name in ("steps", "requests", "decisions", "block_events"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=False)


def test_recorded_replay_of_a_trace_without_steps_is_refused(copy, capsys):
    pq.write_table(pq.read_table(copy / "steps.parquet").slice(0, 0), copy / "steps.parquet")
    assert sim_main(["replay", str(copy), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no steps" in err and "recorded" in err


def test_truncated_tail_warning_is_one_line_of_our_own(copy):
    to_streams(copy)
    with open(copy / "steps.jsonl", "ab") as f:
        f.write(b'{"step": 99999, "start": 1.')
    res = subprocess.run([sys.executable, "-m", "traces", "summary", str(copy)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0
    assert res.stderr.splitlines() == [f"warning: {copy}: trace ends mid-write (steps); read up to the last "
                                       "complete step"]


@pytest.mark.parametrize("argv", [["-m", "traces", "summary"], ["-m", "sim.cli", "compare", "GOOD"]],
                         ids=["traces summary", "sim compare"])
def test_closed_stdout_is_one_line_and_exit_2(argv, good):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head`) is gone before the first byte
    try:
        args = [str(good) if a == "GOOD" else a for a in argv] + [str(good)]
        res = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    finally:
        os.close(write_end)
    assert res.returncode == 2
    assert len(res.stderr.splitlines()) == 1 and "<stdout>" in res.stderr and "Traceback" not in res.stderr


def test_loading_a_good_trace_warns_nothing(good):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traces.load(good)
