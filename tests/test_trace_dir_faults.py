"""Nothing a user has is lost: a trace directory that already holds a trace is refused unless --overwrite,
a replay never writes into its own source, and a directory has one writer at a time (a lock the kernel
drops when the writer dies). Each refusal is one line and exit status 2, with the old trace untouched."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import traces
from sim.cli import main as sim_main
from traces.trace_dir import LOCK_FILE, TraceDirError, TraceDirLock
from traces.writer import TraceWriter

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = str(ROOT / "workloads" / "bursty.yaml")
REPLAY = ["replay", WORKLOAD, "--max-requests", "5", "--no-progress", "--model", "qwen3-0.6b", "--hardware", "h100"]


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    out = tmp_path / "trace"
    assert sim_main([*REPLAY, "--trace", str(out)]) == 0
    return out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_replay_into_a_directory_holding_a_trace_is_refused_and_the_trace_kept(existing, capsys):
    before = _snapshot(existing)
    capsys.readouterr()
    assert sim_main([*REPLAY, "--max-requests", "3", "--trace", str(existing)]) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert _snapshot(existing) == before


def test_overwrite_replaces_the_trace(existing):
    assert sim_main([*REPLAY, "--max-requests", "3", "--trace", str(existing), "--overwrite"]) == 0
    assert len(traces.load(existing).requests) == 3


def test_a_replay_into_its_own_source_is_refused_even_with_overwrite(existing, capsys):
    before = _snapshot(existing)
    capsys.readouterr()
    assert sim_main(["replay", str(existing), "--trace", str(existing), "--overwrite", "--no-progress"]) == 2
    assert "own inputs" in _one_error_line(capsys)
    assert _snapshot(existing) == before


@pytest.mark.parametrize("target", ["", "a_file"])
def test_an_empty_path_or_a_file_as_trace_directory_is_one_line(tmp_path, capsys, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "steps.parquet").write_text("not a trace of ours, but the user's file")
    assert sim_main([*REPLAY, "--trace", target]) == 2
    _one_error_line(capsys)
    assert (tmp_path / "a_file").read_text() == "mine"
    assert (tmp_path / "steps.parquet").read_text() == "not a trace of ours, but the user's file"


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    first = TraceWriter(tmp_path / "t", {"source": "sim"})
    with pytest.raises(TraceDirError, match=f"pid {os.getpid()}"):
        TraceWriter(tmp_path / "t", {"source": "sim"}, overwrite=True)
    first.close()
    assert not (tmp_path / "t" / LOCK_FILE).exists()


CHILD = textwrap.dedent("""
    import sys, time
    from traces.writer import TraceWriter
    w = TraceWriter(sys.argv[1], {"source": "sim"})
    print("writing", flush=True)
    time.sleep(600)
""")


def _child_writing(trace_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(trace_dir)], env=env, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "writing"
    return child


def test_a_writer_in_another_process_keeps_a_replay_out(tmp_path, capsys):
    child = _child_writing(tmp_path / "t")
    try:
        assert sim_main([*REPLAY, "--trace", str(tmp_path / "t"), "--overwrite"]) == 2
        assert f"pid {child.pid}" in _one_error_line(capsys)
    finally:
        child.kill()
        child.wait()


def test_the_lock_of_a_killed_writer_is_free_again(tmp_path):
    child = _child_writing(tmp_path / "t")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert (tmp_path / "t" / LOCK_FILE).exists()
    TraceDirLock(tmp_path / "t", overwrite=True).release()


def test_a_plan_trace_directory_holding_a_trace_is_refused_before_the_sweep(existing, capsys):
    before = _snapshot(existing)
    capsys.readouterr()
    assert sim_main(["plan", WORKLOAD, "--slo", "ttft_p99=2s", "--max-requests", "5", "--trace", str(existing),
                     "--jobs", "1", "--no-progress"]) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert _snapshot(existing) == before


def test_a_price_for_hardware_not_planned_is_refused(capsys):
    assert sim_main(["plan", WORKLOAD, "--slo", "ttft_p99=2s", "--hardware", "h100", "--price", "h200=3/h",
                     "--max-requests", "5", "--jobs", "1", "--no-progress"]) == 2
    assert "h200" in _one_error_line(capsys)


def test_engine_run_into_a_directory_holding_a_trace_is_refused_and_the_trace_kept(existing):
    before = _snapshot(existing)
    out = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--max-requests", "2", "--trace", str(existing),
                          "--no-progress"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "--overwrite" in out.stderr and "Traceback" not in out.stderr
    assert _snapshot(existing) == before
