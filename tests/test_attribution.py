"""The error breakdown of `sim compare` puts a known injected error where it belongs."""
import json

import pytest

import traces
from sim.cli import main
from sim.fidelity.compare import compare_traces
from test_fidelity import record_engine_like


BURST_FLAGS = ["--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--max-model-len", "2048",
               "--num-gpu-blocks-override", "4000"]  # record_engine_like's scheduler and cache


def test_a_device_slower_by_a_known_factor_lands_in_the_step_time_term(tmp_path):
    """A burst that arrives at once is decided the same whatever the step times. Replayed with its own
    profile and with that profile's device law 25% slower, the difference between the two breakdowns is
    all step time: host+gap and decisions stay where they were."""
    record_engine_like(tmp_path / "a", seed=0, mean_gap=0.0)
    prof = tmp_path / "p.json"
    assert main(["calibrate", str(tmp_path / "a"), "-o", str(prof)]) == 0
    slow = json.loads(prof.read_text())
    for law in (slow["coefficients"], slow["parts"]["device"]["coefficients"]):
        law.update({k: v * 1.25 for k, v in law.items()})
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    breakdown = {}
    for name in ("p", "slow"):
        assert main(["replay", str(tmp_path / "a"), "--cost-model", str(tmp_path / f"{name}.json"), *BURST_FLAGS,
                     "--trace", str(tmp_path / name), "--no-progress"]) == 0
        report = compare_traces(traces.load(tmp_path / "a"), traces.load(tmp_path / name))
        assert report["decision_match_rate"] == 1.0
        breakdown[name] = report["attribution"]["metrics"]
    for metric, before in breakdown["p"].items():
        d = {k: breakdown["slow"][metric][k] - before[k] for k in ("total", "step_time", "host_gap", "divergence")}
        slower = d["total"] < 0 if metric.endswith("_tok_s") else d["total"] > 0
        assert slower and d["step_time"] == pytest.approx(d["total"], rel=0.01), metric
        assert abs(d["host_gap"]) + abs(d["divergence"]) <= 0.01 * abs(d["total"]), metric
