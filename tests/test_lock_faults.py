"""A trace directory's lock holds under contention: processes taking and releasing it in a loop are never
two holders at once, however their takes and releases interleave."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HAMMER = textwrap.dedent("""
    import os, sys, time
    from traces.trace_dir import TraceDirError, TraceDirLock

    directory, marker, until = sys.argv[1], sys.argv[2], float(sys.argv[3])
    takes = overlaps = 0
    while time.time() < until:
        try:
            lock = TraceDirLock(directory, overwrite=True)
        except TraceDirError:
            continue
        takes += 1
        try:  # the marker exists only while someone holds the lock: finding it means two holders
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            overlaps += 1
        else:
            time.sleep(0.0002)
            os.unlink(marker)
        lock.release()
    print(takes, overlaps)
""")


def test_processes_hammering_one_lock_are_never_two_holders_at_once(tmp_path):
    until = time.time() + 5
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(tmp_path / "t"), str(tmp_path / "held"), str(until)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(3)]
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        counts.append(tuple(map(int, out.split())))
    assert sum(t for t, _ in counts) > 50, counts  # they really took turns
    assert sum(o for _, o in counts) == 0, counts
