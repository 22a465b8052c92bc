"""One output rule for every command that writes: an output never lands on, over or inside one of the
command's inputs, a device or a pipe is written as a stream (never renamed over), a directory is a trace
only when its meta.json reads as one, and links inside a trace directory are never followed. Every
refusal is one line, exit status 2, and leaves the inputs as they were."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

import traces
from sim.cli import main as sim_main
from traces.__main__ import main as traces_main
from traces.trace_dir import LOCK_FILE

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = str(ROOT / "workloads" / "bursty.yaml")
REPLAY = ["replay", WORKLOAD, "--max-requests", "4", "--no-progress", "--model", "qwen3-0.6b", "--hardware", "h100"]


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file() and not p.is_symlink()}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("src") / "trace"
    assert sim_main([*REPLAY, "--trace", str(out)]) == 0
    return out


def test_export_to_a_character_device_writes_into_it_and_leaves_it_a_device(trace, tmp_path, capsys):
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of the test's own
    except PermissionError:
        pytest.skip("cannot make a device node here")
    assert traces_main(["export", str(trace), "-o", str(node)]) == 0
    assert stat.S_ISCHR(os.stat(node).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name != "null"]


def test_export_to_a_named_pipe_streams_into_it(trace, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert traces_main(["export", str(trace), "-o", str(fifo)]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["traceEvents"]


def test_export_to_a_directory_is_one_line(trace, tmp_path, capsys):
    assert traces_main(["export", str(trace), "-o", str(tmp_path)]) == 2
    assert "directory" in _one_error_line(capsys)


def test_calibrate_output_onto_the_trace_it_reads_is_refused(trace, capsys):
    before = _snapshot(trace)
    assert sim_main(["calibrate", str(trace), "-o", str(trace / "meta.json")]) == 2
    assert "own inputs" in _one_error_line(capsys)
    assert _snapshot(trace) == before


def test_plan_results_onto_its_workload_are_refused(tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(Path(WORKLOAD).read_text())
    before = workload.read_bytes()
    assert sim_main(["plan", str(workload), "--slo", "ttft_p99=2s", "--results", str(workload),
                     "--max-requests", "4", "--no-progress", "--jobs", "1"]) == 2
    assert "own inputs" in _one_error_line(capsys)
    assert workload.read_bytes() == before


def test_plan_trace_directory_holding_its_workload_is_refused(tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(Path(WORKLOAD).read_text())
    assert sim_main(["plan", str(workload), "--slo", "ttft_p99=2s", "--trace", str(tmp_path), "--overwrite",
                     "--max-requests", "4", "--no-progress", "--jobs", "1"]) == 2
    assert "contains" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.yaml"]


def test_replay_trace_inside_its_source_is_refused(trace, capsys):
    before = _snapshot(trace)
    assert sim_main(["replay", str(trace), "--trace", str(trace / "again"), "--no-progress"]) == 2
    assert "lies inside" in _one_error_line(capsys)
    assert _snapshot(trace) == before and not (trace / "again").exists()


def test_compare_plots_into_a_compared_trace_are_refused(trace, capsys):
    before = _snapshot(trace)
    assert sim_main(["compare", str(trace), str(trace), "--plots", str(trace)]) == 2
    _one_error_line(capsys)
    assert _snapshot(trace) == before


def test_overwrite_never_removes_files_that_only_carry_trace_names(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "meta.json").write_text('{"name": "my project"}')
    (project / "steps.parquet").write_text("the user's own file")
    before = _snapshot(project)
    assert sim_main([*REPLAY, "--trace", str(project), "--overwrite"]) == 2
    assert "no trace" in _one_error_line(capsys)
    assert _snapshot(project) == before


def test_import_run_output_inside_its_run_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "vllm").mkdir(parents=True)
    (run / "vllm" / "meta.json").write_text("{}")
    before = _snapshot(run / "vllm")
    assert sim_main(["import-run", str(run), "-o", str(run / "vllm"), "--overwrite"]) == 2
    assert "own inputs" in _one_error_line(capsys)
    assert _snapshot(run / "vllm") == before


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, capsys):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "trace"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(precious)
    assert sim_main([*REPLAY, "--trace", str(out)]) == 2
    assert "link" in _one_error_line(capsys)
    assert precious.read_text() == "keep me"


def test_a_dangling_link_in_a_trace_directory_is_never_written_through(tmp_path, capsys):
    out = tmp_path / "trace"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.arrows"
    (out / "steps.arrows").symlink_to(elsewhere)
    assert sim_main([*REPLAY, "--trace", str(out)]) == 2
    assert "link" in _one_error_line(capsys)
    assert not os.path.lexists(elsewhere)


def test_a_symlink_loop_as_trace_directory_is_one_line(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert sim_main([*REPLAY, "--trace", str(tmp_path / "a")]) == 2
    assert "loop" in _one_error_line(capsys)


def test_a_plots_path_that_is_a_file_is_refused_before_the_replay(tmp_path, capsys):
    (tmp_path / "plots").write_text("a file")
    assert sim_main([*REPLAY, "--trace", str(tmp_path / "t"), "--plots", str(tmp_path / "plots")]) == 2
    _one_error_line(capsys)
    assert not os.path.exists(tmp_path / "t" / "meta.json")


def test_a_trace_directory_cut_short_still_counts_as_a_trace(trace, tmp_path, capsys):
    out = tmp_path / "t"
    assert sim_main([*REPLAY, "--trace", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "complete": False}))
    capsys.readouterr()
    assert sim_main([*REPLAY, "--trace", str(out)]) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert traces.load(out).meta["complete"] is False
