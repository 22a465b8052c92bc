"""Files a command reads whole are read with a cap, whatever their size: a huge (here sparse) meta.json or
cost profile is one line naming it, not a read of everything it holds."""
from __future__ import annotations

import pytest

import traces
from sim.cost_models.profile import MAX_PROFILE_BYTES, load_profile
from traces.meta import MAX_META_BYTES
from traces.streams import MAX_ROW_BYTES


def _sparse(path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def test_a_meta_json_past_its_bound_is_one_line(tmp_path):
    _sparse(tmp_path / "meta.json", MAX_META_BYTES + 1)
    with pytest.raises(traces.TraceError, match="too large"):
        traces.load(tmp_path)


def test_a_cost_profile_past_its_bound_is_one_line(tmp_path):
    _sparse(tmp_path / "p.json", MAX_PROFILE_BYTES + 1)
    with pytest.raises(ValueError, match="too large"):
        load_profile(tmp_path / "p.json")


def test_a_stream_whose_last_line_never_ends_is_one_line(tmp_path):
    from traces.writer import TraceWriter

    writer = TraceWriter(tmp_path / "t", {"source": "sim"})
    writer.lock.release()  # a run killed mid-write: its streams stay as they are
    _sparse(tmp_path / "t" / "steps.jsonl", MAX_ROW_BYTES + (1 << 16))
    with pytest.raises(traces.TraceError, match="not JSON lines"):
        traces.load(tmp_path / "t")
