"""`sim compare` and the TUI's compare view count divergent steps by one definition (traces.diff)."""
import pytest

import traces
from sim.cli import main as sim_main
from sim.fidelity.compare import compare_traces
from tui.compare import Comparison
from tui.loader import open_trace
from tui.model import RunIndex
from workloads import DEFAULT_WORKLOAD


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    for name, seqs in (("a", "8"), ("b", "6")):
        assert sim_main(["replay", str(DEFAULT_WORKLOAD), "--max-requests", "16", "--max-num-seqs", seqs,
                         "--num-gpu-blocks-override", "400", "--trace", str(root / name), "--no-progress",
                         "--json"]) == 0
    return root / "a", root / "b"


def test_tui_and_sim_compare_find_the_same_divergent_steps(two_runs):
    a, b = two_runs
    report = compare_traces(traces.load(a), traces.load(b))
    view = Comparison(RunIndex(open_trace(a), "A"), RunIndex(open_trace(b), "B"))
    assert report["first_divergent_step"] == view.first_divergence is not None
    assert len(view.divergent) == max(report["steps_a"], report["steps_b"]) - report["matched_steps"]


def test_a_run_compared_with_itself_has_no_divergent_step(two_runs):
    a, _ = two_runs
    view = Comparison(RunIndex(open_trace(a), "A"), RunIndex(open_trace(a), "B"))
    assert view.first_divergence is None and compare_traces(traces.load(a), traces.load(a))["matched_steps"] > 0
