"""`sim replay --samples/--step-noise` only with a cost model that declares measured spread
(`has_residuals`); the interval is printed as the prediction, kept in the trace's meta, and `sim compare`
says where a measured run falls against it."""
import contextlib
import io
import json

import numpy as np
import pytest

import traces
from sim.cli import main
from sim.cost_models.calibrated import CalibratedCostModel
from sim.cost_models.residuals import ResidualScaled, residual_table
from sim_helpers import TINY_WORKLOAD, FlatCost
from test_fidelity import record_engine_like
from test_kernel_models import write_bundle


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two engine-like traces, a profile fitted on the first (with its residual table) and the same
    profile with the table taken out."""
    root = tmp_path_factory.mktemp("spread")
    record_engine_like(root / "a", seed=0)
    record_engine_like(root / "b", seed=1)
    assert main(["calibrate", str(root / "a"), "-o", str(root / "p.json")]) == 0
    profile = json.loads((root / "p.json").read_text())
    assert profile.get("residuals")
    profile["residuals"] = None
    (root / "flat.json").write_text(json.dumps(profile))
    return root


@pytest.fixture(scope="module")
def sampled(runs, tmp_path_factory):
    """`sim replay B --samples 3` with the profile: its stdout and its trace directory."""
    out = tmp_path_factory.mktemp("sampled") / "replay"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["replay", str(runs / "b"), "--cost-model", str(runs / "p.json"), "--samples", "3",
                     "--no-progress", "--trace", str(out)]) == 0
    return buf.getvalue(), out


def _refused(argv, capsys, flag):
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"sim replay: error: {flag}:") and "every seeded replay would be the same" in err
    return cap


def test_samples_with_a_profile_bundle_is_refused_before_any_simulation(tmp_path, capsys):
    bundle = write_bundle(tmp_path / "bundle")
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    cap = _refused(["replay", str(workload), "--cost-model", str(bundle), "--model", "qwen3-0.6b", "--samples", "3",
                    "--no-progress", "--trace", str(tmp_path / "t")], capsys, "--samples")
    assert "simulating" not in cap.out and not (tmp_path / "t" / "meta.json").exists()


def test_step_noise_with_a_profile_without_residuals_is_refused(runs, tmp_path, capsys):
    _refused(["replay", str(runs / "b"), "--cost-model", str(runs / "flat.json"), "--step-noise", "--no-progress",
              "--trace", str(tmp_path / "t")], capsys, "--step-noise")


def test_samples_with_a_profile_without_residuals_is_refused(runs, tmp_path, capsys):
    _refused(["replay", str(runs / "b"), "--cost-model", str(runs / "flat.json"), "--samples", "2", "--no-progress",
              "--trace", str(tmp_path / "t")], capsys, "--samples")


def test_only_a_model_with_measured_residuals_declares_spread(runs):
    table = residual_table(np.ones((8, 3)), [8])
    assert CalibratedCostModel.load(runs / "p.json").has_residuals
    assert not CalibratedCostModel.load(runs / "flat.json").has_residuals
    assert not FlatCost().has_residuals
    assert ResidualScaled(FlatCost(), table, seed=0).has_residuals


def test_samples_output_names_the_interval_as_the_prediction(sampled):
    out, _ = sampled
    assert "prediction (90% interval over 3 seeded replays" in out
    assert "unperturbed replay" in out and "not the prediction" in out
    assert out.index("unperturbed replay") < out.index("prediction (90%")
    assert "sampled replays:" not in out


def test_sampled_replay_trace_records_the_interval_per_metric(sampled):
    _, trace_dir = sampled
    prediction = traces.load(trace_dir).meta["prediction"]
    assert prediction["num_samples"] == 3
    assert {"ttft_p50_s", "tpot_p99_s", "output_throughput_tok_s"} <= set(prediction["metrics"])
    assert all(m["p5"] <= m["p50"] <= m["p95"] for m in prediction["metrics"].values())


def test_compare_scores_whether_a_measured_value_falls_inside_the_interval(runs, sampled, capsys):
    _, trace_dir = sampled
    assert main(["compare", str(runs / "b"), str(trace_dir), "--json"]) == 0
    iv = json.loads(capsys.readouterr().out)["interval"]
    measured = traces.load(runs / "b")
    from traces.summary import summarize

    values = summarize(measured.requests, measured.steps)
    for name, m in iv["metrics"].items():
        assert m["inside"] == (m["p5"] <= values[name] <= m["p95"])
    assert iv["scored"] == len(iv["metrics"]) and iv["inside"] == sum(m["inside"] for m in iv["metrics"].values())


def test_compare_prints_the_coverage_count(runs, sampled, capsys):
    _, trace_dir = sampled
    assert main(["compare", str(runs / "b"), str(trace_dir)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("A inside B's prediction"))
    assert "over 3 seeded replays" in line and line.endswith("of 10 metrics")
