"""A SIGKILL while a trace is being compacted to Parquet loses nothing: each Parquet file is written under a
temporary name and renamed, so the reader finds either a whole Parquet file or the JSON lines."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd

import traces
from traces.writer import TraceWriter

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["replay", str(ROOT / "workloads" / "bursty.yaml"), "--cost-model", "roofline", "--model", "qwen3-0.6b",
        "--hardware", "h100", "--max-requests", "150", "--no-progress"]

# The child writes the trace, then stops inside compaction of the `requests` table, right after a batch of it
# has gone to disk, and says so: the parent kills it there, with no timing race.
CHILD = textwrap.dedent("""
    import sys, time
    import pyarrow.parquet as pq
    from sim.cli import main

    write_table = pq.ParquetWriter.write_table  # write_batch goes through it too

    def write_then_stall(self, table, *args, **kwargs):
        write_table(self, table, *args, **kwargs)
        if "requests.parquet" in str(self.where):
            self.file_handle.flush() if self.file_handle is not None else None
            print("compacting requests", flush=True)
            time.sleep(600)

    pq.ParquetWriter.write_table = write_then_stall
    sys.exit(main(sys.argv[1:]))
""")


def _killed_during_compaction(trace_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, *ARGS, "--trace", str(trace_dir)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        lines = iter(child.stdout.readline, "")
        assert any(line.strip() == "compacting requests" for line in lines)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL


def test_sigkill_during_compaction_leaves_every_written_row_loadable(tmp_path):
    from sim.cli import main

    killed, clean = tmp_path / "killed", tmp_path / "clean"
    _killed_during_compaction(killed)
    names = {p.name for p in killed.iterdir()}
    # The simulator streams Arrow record batches (requests.arrows); JSON-lines writers leave requests.jsonl.
    # Two tables compact at a time, so another table may be whole, half-written or not yet begun.
    assert "requests.arrows" in names and "requests.parquet" not in names
    assert any(n.startswith("requests.parquet.") and n.endswith(".tmp") for n in names)  # the half-written one
    assert main([*ARGS, "--trace", str(clean)]) == 0
    a, b = traces.load(clean), traces.load(killed)
    assert not b.complete
    for name in ("steps", "requests", "decisions", "block_events", "block_snapshots"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=False, obj=name)


def test_a_new_writer_clears_temporaries_a_killed_compaction_left(tmp_path):
    stale = tmp_path / "steps.parquet.123.tmp"
    stale.write_bytes(b"half a parquet file")
    TraceWriter(tmp_path, {"source": "sim"}).close()
    assert not stale.exists() and (tmp_path / "steps.parquet").is_file()
