"""A trace survives the ways a process ends: SIGTERM (kill, timeout, docker stop, systemd) ends a run as
Ctrl-C does, with a complete trace and exit status 143; an engine idle between arrivals has written what
it did, so a SIGKILL then loses nothing; every command that opens a trace closes it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trace_builders import interrupt_traced_run

import traces

ROOT = Path(__file__).resolve().parent.parent
ENGINE = [sys.executable, "-m", "engine.cli"]
SIM = [sys.executable, "-m", "sim.cli"]
FLAGS = ["--device", "cpu", "--max-num-seqs", "4", "--kv-cache-memory", str(16 << 20), "--max-model-len", "256",
         "--no-progress"]


def _workload(tmp_path: Path, arrival: str, n: int, out_tokens: int) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(f"name: w\nseed: 1\nnum_requests: {n}\narrival: {arrival}\n"
                    "prompt_tokens: {dist: fixed, value: 16}\n"
                    f"output_tokens: {{dist: fixed, value: {out_tokens}}}\n")
    return path


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_sigterm_ends_an_engine_run_with_a_complete_trace_and_status_143(tmp_path):
    workload = _workload(tmp_path, "{process: constant, rate: 2.0}", 40, 24)
    out = tmp_path / "trace"
    proc = _start([*ENGINE, "run", "--workload", str(workload), "--trace", str(out), *FLAGS])
    _wait_for(out / "steps.jsonl", proc)
    t = interrupt_traced_run(proc, signal.SIGTERM, out, exit_status=143)
    assert len(t.steps) >= 1


def test_sigterm_ends_a_replay_with_a_complete_trace_and_status_143(tmp_path):
    workload = _workload(tmp_path, "{process: poisson, rate: 50.0}", 2_000_000, 64)
    out = tmp_path / "trace"
    proc = _start([*SIM, "replay", str(workload), "--trace", str(out), "--no-progress", "--model", "qwen3-0.6b",
                   "--hardware", "h100"])
    _wait_for(out / "steps.arrows", proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert traces.load(out).complete


# The engine with hand-offs to its trace writer held back for an hour: only an idle flush writes steps.
ENGINE_HELD_BACK = [sys.executable, "-c", "import sys; from traces.writer import TraceWriter; "
                    "TraceWriter.HANDOFF_S = 3600; from engine.cli import main; sys.exit(main(sys.argv[1:]))"]


def test_an_idle_engine_has_written_every_step_and_finish_before_a_kill(tmp_path):
    # The first request arrives at 6 s and the next at 12 s: in between, the engine waits.
    workload = _workload(tmp_path, "{process: constant, rate: 0.1667}", 3, 8)
    out = tmp_path / "trace"
    proc = _start([*ENGINE_HELD_BACK, "run", "--workload", str(workload), "--trace", str(out), *FLAGS])
    _wait_for(out / "steps.jsonl", proc)
    time.sleep(2.5)  # eight short steps, then idle
    proc.kill()
    proc.communicate(timeout=60)
    t = traces.load(out)
    assert not t.complete
    assert len(t.steps) == 8  # a prefill step and seven decode steps
    finished = t.requests.dropna(subset=["finish"])
    assert list(finished["request_id"]) == [t.requests["request_id"].iloc[0]]


def test_engine_generate_closes_the_trace_it_opens(tmp_path):
    out = tmp_path / "trace"
    res = subprocess.run([*ENGINE, "generate", "hello", "--max-tokens", "4", "--trace", str(out),
                          "--device", "cpu", "--kv-cache-memory", str(16 << 20), "--max-model-len", "256"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "meta.json").read_text())["complete"] is True
    assert len(traces.load(out).requests) == 1
