"""With identical decisions at every step, `sim compare`'s error breakdown has no decision term: A's
decisions run on B's times is then B itself, whatever the re-timing's own approximations."""
import pytest

import traces
from sim.fidelity.compare import compare_traces, format_report
from test_fidelity import record_engine_like


@pytest.fixture(scope="module")
def same_decisions_other_times(tmp_path_factory):
    """Two runs of the same requests, B's device 30% slower: arrivals far enough apart that every step
    decides alike, close enough that some arrive mid-spell (where the re-timing carries them along)."""
    root = tmp_path_factory.mktemp("zero")
    record_engine_like(root / "a", seed=0, num_requests=12, mean_gap=0.5)
    record_engine_like(root / "b", seed=0, num_requests=12, mean_gap=0.5, speed=1.3)
    report = compare_traces(traces.load(root / "a"), traces.load(root / "b"))
    assert report["decision_match_rate"] == 1.0 and report["first_divergent_step"] is None
    return report


def test_identical_decisions_leave_exactly_zero_in_the_decision_term(same_decisions_other_times):
    metrics = same_decisions_other_times["attribution"]["metrics"]
    assert any(m["total"] != 0 for m in metrics.values())
    for name, m in metrics.items():
        assert m["divergence"] == 0.0, name


def test_identical_decisions_put_the_whole_difference_in_the_timing_terms(same_decisions_other_times):
    for name, m in same_decisions_other_times["attribution"]["metrics"].items():
        timing = m["step_time"] + m["host_gap"] + m["retiming"]
        assert timing == pytest.approx(m["total"], rel=1e-9, abs=1e-12), name


def test_the_report_shows_a_zero_decision_column_when_every_decision_matches(same_decisions_other_times):
    lines = format_report(same_decisions_other_times).splitlines()
    rows = lines[lines.index(next(x for x in lines if x.startswith("error breakdown"))) + 1:]
    rows = [x for x in rows if " total " in x]
    assert rows and all(x.split("|")[2].strip() == "+0.00%" for x in rows), rows
