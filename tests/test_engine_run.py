"""`engine run` end to end in a subprocess: a clean run, SIGKILL and Ctrl-C mid-run, bad workloads."""
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
from trace_builders import interrupt_traced_run

import traces

WORKLOAD = """\
name: tiny
seed: 3
num_requests: 40
arrival: {process: poisson, rate: 30.0}
prompt_tokens: {dist: uniform, min: 16, max: 96}
output_tokens: {dist: uniform, min: 24, max: 48}
prefix: {groups: 2, tokens: 32, fraction: 0.5}
"""
ENGINE = [sys.executable, "-m", "engine.cli"]
FLAGS = ["--device", "cpu", "--max-num-seqs", "4", "--kv-cache-memory", str(16 << 20), "--max-model-len", "256",
         "--no-progress"]


@pytest.fixture()
def workload(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(WORKLOAD)
    return path


def _default_sigint() -> None:
    """A shell that runs pytest in the background ignores SIGINT, and children inherit that; Python then
    installs no KeyboardInterrupt handler, so the Ctrl-C test needs the default disposition back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(ENGINE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint, **kw)


def _wait_for_steps(trace_dir, n, proc, timeout=120):
    deadline = time.time() + timeout
    path = trace_dir / "steps.jsonl"
    while time.time() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("engine run wrote no steps in time")


def test_clean_run_writes_a_complete_trace_and_a_summary(tmp_path, workload):
    out = tmp_path / "trace"
    res = subprocess.run(ENGINE + ["run", "--workload", str(workload), "--trace", str(out), *FLAGS],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "requests: 40 finished of 40" in res.stdout and "ttft: p50" in res.stdout
    t = traces.load(out)
    assert t.complete and len(t.requests) == 40 and (t.requests["finish_reason"] == "length").all()
    assert t.meta["workload"]["name"] == "tiny"
    assert t.requests["num_cached_tokens"].sum() > 0  # the shared prefixes hit


def test_sigkill_mid_run_leaves_a_trace_readable_to_its_last_step(tmp_path, workload):
    out = tmp_path / "trace"
    proc = _start(["run", "--workload", str(workload), "--trace", str(out), *FLAGS])
    _wait_for_steps(out, 8, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", traces.TruncatedTraceWarning)
        t = traces.load(out)
    assert not t.complete
    assert len(t.steps) >= 8 and list(t.steps["step"]) == list(range(len(t.steps)))
    assert t.decisions["step"].max() <= t.steps["step"].max()


def test_ctrl_c_ends_cleanly_with_a_complete_trace(tmp_path):
    # Arrivals spread over ~20 s, so the run is still going when Ctrl-C comes, however fast the engine is.
    workload = tmp_path / "slow.yaml"
    workload.write_text(WORKLOAD.replace("rate: 30.0", "rate: 2.0"))
    out = tmp_path / "trace"
    proc = _start(["run", "--workload", str(workload), "--trace", str(out), *FLAGS])
    _wait_for_steps(out, 5, proc)
    t = interrupt_traced_run(proc, signal.SIGINT, out, exit_status=130)
    assert len(t.steps) >= 5


@pytest.mark.parametrize("text,field", [
    ("name: x\nnum_requests: 5\narrival: {process: poisson, rate: -1}\n"
     "prompt_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 8}\n", "arrival"),
    ("name: x\nnum_requests: 5\narrival: {process: warp, rate: 1}\n"
     "prompt_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 8}\n", "arrival"),
    ("name: x\nnum_requests: 5\narrival: {process: poisson, rate: 1}\n"
     "prompt_tokens: {dist: fixed, valu: 8}\noutput_tokens: {dist: fixed, value: 8}\n", "prompt_tokens"),
    ("name: [unclosed\n", ""),
])
def test_malformed_workload_is_one_line_naming_file_and_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    res = subprocess.run(ENGINE + ["run", "--workload", str(path), *FLAGS], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and field in lines[0], res.stderr


def test_missing_workload_file_is_one_line(tmp_path):
    res = subprocess.run(ENGINE + ["run", "--workload", str(tmp_path / "nope.yaml"), *FLAGS],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "nope.yaml" in res.stderr
