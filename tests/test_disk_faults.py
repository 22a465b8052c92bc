"""Faults of the machine, injected into real processes: a disk that fills midway, a read-only disk, and a
second Ctrl-C while a trace is compacted. Each ends in one line naming the path and exit status 2 (130 for
Ctrl-C), never a traceback, and every step written before the fault stays readable.

A full disk is a small tmpfs mounted in a private mount namespace (`unshare -m`, where this user may
mount one), else a per-file size limit (RLIMIT_FSIZE), which fails the same writes with EFBIG instead of
ENOSPC. A read-only disk needs the mount, or a user that is not root (a mode-0555 directory)."""
from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import traces
from traces.schema import TEMP_SUFFIX
from traces.trace_dir import LOCK_FILE, TraceDirLock, TraceWriteError
from traces.writer import TraceWriter

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
WORKLOAD = str(ROOT / "workloads" / "bursty.yaml")
ENGINE = [sys.executable, "-m", "engine.cli", "run", "--no-progress"]
SIM = [sys.executable, "-m", "sim.cli", "replay", WORKLOAD, "--no-progress", "--model", "qwen3-0.6b",
       "--hardware", "h100"]
DISK_KIB = 96
FULL = ("No space left on device", "File too large")

# sh -c SCRIPT sh MOUNT KEEP OPTIONS CMD...: mount a tmpfs on MOUNT, run CMD, copy what it left to KEEP.
MOUNTED = 'mount -t tmpfs -o "$3" tmpfs "$1" || exit 99; m=$1; k=$2; shift 3; "$@"; rc=$?; cp -a "$m"/. "$k"/; exit $rc'


@functools.cache
def can_mount() -> bool:
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0"', str(probe)],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_on_disk(cmd: list[str], tmp_path: Path, mount_options: str | None = None,
                max_file_bytes: int | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run `cmd` (its `{disk}` arguments pointing into the disk) and return what it left there, copied out."""
    disk, keep = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    keep.mkdir()
    argv = [a.replace("{disk}", str(disk)) for a in cmd]
    limit = None
    if mount_options is not None:
        argv = ["unshare", "-m", "sh", "-c", MOUNTED, "sh", str(disk), str(keep), mount_options, *argv]
    elif max_file_bytes is not None:
        limit = max_file_bytes
    out = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600,
                         preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))) if limit else None)
    assert out.returncode != 99, f"tmpfs mount failed: {out.stderr}"
    return out, (keep if mount_options is not None else disk)


def run_on_full_disk(cmd: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    if can_mount():
        return run_on_disk(cmd, tmp_path, mount_options=f"size={DISK_KIB}k")
    return run_on_disk(cmd, tmp_path, max_file_bytes=DISK_KIB << 10)


def one_error(stderr: str, prog: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith(f"{prog}: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def readable_steps(trace_dir: Path) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = traces.load(trace_dir)
    assert not trace.complete
    return len(trace.steps)


def no_leftovers(trace_dir: Path) -> bool:
    return not list(trace_dir.glob(f"*{TEMP_SUFFIX}")) and not (trace_dir / LOCK_FILE).exists()


def test_engine_run_on_a_disk_that_fills_ends_in_one_line_with_the_steps_written_readable(tmp_path):
    out, kept = run_on_full_disk([*ENGINE, "--max-requests", "40", "--trace", "{disk}/t"], tmp_path)
    assert out.returncode == 2, out.stderr
    line = one_error(out.stderr, "engine run")
    assert f"{tmp_path / 'disk' / 't'}" in line and any(why in line for why in FULL), line
    assert out.stderr.count("cannot write spans") <= 1  # said once, whenever the spans' writer met the full disk
    assert readable_steps(kept / "t") > 0
    assert no_leftovers(kept / "t")


def test_sim_replay_on_a_disk_that_fills_ends_in_one_line_with_the_trace_readable(tmp_path):
    out, kept = run_on_full_disk([*SIM, "--max-requests", "600", "--trace", "{disk}/t"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert any(why in one_error(out.stderr, "sim replay") for why in FULL)
    readable_steps(kept / "t")
    assert no_leftovers(kept / "t")


def _read_only(tmp_path: Path, cmd: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    if can_mount():
        return run_on_disk(cmd, tmp_path, mount_options="ro,size=64k")
    if os.geteuid() == 0:
        pytest.skip("a read-only disk needs a tmpfs mount (unshare -m) or a user other than root")
    out, disk = None, tmp_path / "disk"
    disk.mkdir(mode=0o555)
    try:
        out = subprocess.run([a.replace("{disk}", str(disk)) for a in cmd], cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=600)
    finally:
        disk.chmod(0o755)
    return out, disk


@pytest.mark.parametrize("prog, cmd", [("engine run", [*ENGINE, "--max-requests", "2", "--trace", "{disk}/t"]),
                                       ("sim replay", [*SIM, "--max-requests", "5", "--trace", "{disk}/t"])])
def test_a_trace_on_a_read_only_disk_is_one_line_naming_the_directory(tmp_path, prog, cmd):
    out, _ = _read_only(tmp_path, cmd)
    assert out.returncode == 2, out.stderr
    line = one_error(out.stderr, prog)
    assert "/disk/t" in line and ("Read-only" in line or "Permission denied" in line), line


def _steps(path: Path, n: int = 5, **kw) -> TraceWriter:
    w = TraceWriter(path, {"source": "sim"}, **kw)
    for i in range(n):
        w.write_rows("steps", [{"step": i, "start": i * 0.01, "end": i * 0.01 + 0.008}])
        w.flush()
    return w


def _fail_parquet(monkeypatch, error: BaseException) -> None:
    import pyarrow.parquet as pq

    def fail(*_a, **_k):
        raise error
    monkeypatch.setattr(pq.ParquetWriter, "write_batch", fail)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", fail)


@pytest.mark.parametrize("stream_format", ["jsonl", "arrow"])
def test_a_disk_full_while_compacting_keeps_the_streams_and_leaves_no_temporary_file(tmp_path, monkeypatch,
                                                                                     stream_format):
    w = _steps(tmp_path / "t", stream_format=stream_format)
    _fail_parquet(monkeypatch, OSError(28, "No space left on device"))
    with pytest.raises(TraceWriteError, match="No space left on device.*stays readable from the streams"):
        w.close()
    monkeypatch.undo()
    assert readable_steps(tmp_path / "t") == 5
    assert no_leftovers(tmp_path / "t")


@pytest.mark.parametrize("stream_format", ["jsonl", "arrow"])
def test_a_second_ctrl_c_while_compacting_leaves_no_temporary_file_and_frees_the_directory(tmp_path, monkeypatch,
                                                                                          stream_format):
    w = _steps(tmp_path / "t", stream_format=stream_format)
    _fail_parquet(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        w.close()
    monkeypatch.undo()
    assert readable_steps(tmp_path / "t") == 5
    assert no_leftovers(tmp_path / "t")
    TraceDirLock(tmp_path / "t", overwrite=True).release()


def test_engine_run_interrupted_while_compacting_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.setattr(TraceWriter, "_compact", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert main(["run", "--max-requests", "2", "--no-progress", "--trace", str(tmp_path / "t")]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "engine run: interrupted" in err
    assert readable_steps(tmp_path / "t") > 0
