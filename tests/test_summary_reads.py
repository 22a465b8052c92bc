"""Summaries read only the columns they need, ids and events as Categoricals, from a compacted trace and
from a crash-recovered (JSON-lines) one alike, so a long run's summary does not balloon."""
import shutil

import pandas as pd
import pytest
from trace_damage import to_streams

import traces
from sim.cli import main as sim_main
from sim.report import SUMMARY_READ, load_for_summary, sim_summary
from workloads import DEFAULT_WORKLOAD


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same small simulated trace, compacted and as JSON lines."""
    root = tmp_path_factory.mktemp("reads")
    assert sim_main(["replay", str(DEFAULT_WORKLOAD), "--cost-model", "roofline", "--model", "qwen3-0.6b",
                     "--hardware", "h100", "--max-requests", "20", "--trace", str(root / "pq"), "--no-progress"]) == 0
    shutil.copytree(root / "pq", root / "jsonl")
    to_streams(root / "jsonl")
    return root / "pq", root / "jsonl"


@pytest.mark.parametrize("kind", [0, 1], ids=["parquet", "json-lines"])
def test_summary_load_reads_only_the_needed_columns(pair, kind):
    t = load_for_summary(pair[kind])
    for table, cols in SUMMARY_READ.items():
        assert list(getattr(t, table).columns) == list(cols)
    assert len(t.block_events) == 0 and "prompt_token_ids" not in t.requests.columns


@pytest.mark.parametrize("kind", [0, 1], ids=["parquet", "json-lines"])
def test_summary_load_keeps_ids_and_events_as_categoricals(pair, kind):
    d = load_for_summary(pair[kind]).decisions
    assert all(isinstance(d[c].dtype, pd.CategoricalDtype) for c in ("request_id", "event", "phase"))


def _same(a: dict, b: dict) -> bool:
    """Equal summaries: numbers within rounding (NaN for metrics without samples), the rest exactly."""
    numbers = {k: v for k, v in a.items() if isinstance(v, float | int)}
    return (a.keys() == b.keys() and numbers == pytest.approx({k: b[k] for k in numbers}, nan_ok=True)
            and all(a[k] == b[k] for k in a if k not in numbers))


def test_summary_from_the_light_load_equals_the_one_from_a_full_load(pair):
    assert _same(sim_summary(load_for_summary(pair[0])), sim_summary(traces.load(pair[0])))


def test_json_lines_and_parquet_give_the_same_summary(pair):
    assert _same(sim_summary(load_for_summary(pair[1])), sim_summary(load_for_summary(pair[0])))
