"""Fidelity of the calibrated simulator: per-part laws fitted with every step kept, seeded residual
sampling whose intervals cover the truth, the out-of-range warning, and sim compare's error breakdown."""
import json

import numpy as np
import pytest

import traces
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.outputs import ModelRunnerOutput
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from sim.cost_models.batch import StepBatch, batch_from_output, causal_pairs
from sim.calibration.calibrate import calibrate
from sim.cli import main
from sim.fidelity.compare import compare_traces, format_report
from sim.cost_models.calibrated import CalibratedCostModel
from sim.cost_models.profile import CostProfile, PartLaw
from sim.cost_models.parts import DEVICE_TERMS, part_matrix
from sim.cost_models.residuals import ResidualSampler, predictive_level, residual_table
from sim.calibration.fit import fit_mean_law
from sim.fidelity.samples import interval
from sim.fidelity.speed_shift import same_shape_speed
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from sim_helpers import FlatCost
from recording import record_step
from trace_builders import steps_as_requests_arrive

DEVICE = {"c0": 2e-3, "c_p": 5e-5, "c_d": 2e-4, "c_ctx": 1e-6, "c_attn": 1e-7, "c_seq": 1e-4, "c_pseq": 1e-3}
HOST = (3e-4, 2e-5)  # per step, per sequence
GAP = (5e-4, 3e-5)
META = {"source": "engine", "device": {"type": "cpu", "name": "test-cpu"},
        "config": {"model": {"model": "builtin", "architecture": "Qwen3ForCausalLM", "dtype": "float32"}}}


def device_law(b: StepBatch) -> float:
    return float(part_matrix("device", [b])[0] @ np.array([DEVICE[k] for k in DEVICE_TERMS]))


def record_engine_like(path, seed=0, num_requests=40, noise=0.02, speed=1.0, trace_level="full", mean_gap=0.02):
    """A trace timed like the engine: each step's model time follows the law (times `speed`), host phases
    and the gap before the next step follow their own laws, all with `noise`; requests arrive on that clock."""
    rng = np.random.default_rng(seed)
    now = [0.0]
    sched = Scheduler(SchedulerConfig(max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=256),
                      CacheConfig(block_size=16, num_gpu_blocks=4000), clock=lambda: now[0])
    rec = TraceRecorder(TraceWriter(path, META), sched, trace_level=trace_level)
    arrivals = np.cumsum(rng.exponential(mean_gap, num_requests)) if mean_gap else np.zeros(num_requests)
    pending = [Request(f"r{i}", [int(x) for x in rng.integers(3, 30000, int(rng.integers(20, 300)))],
                       SamplingParams(max_tokens=int(rng.integers(4, 30)), ignore_eos=True, temperature=0.0),
                       eos_token_id=2, arrival_time=float(a)) for i, a in enumerate(arrivals)]
    for _ in steps_as_requests_arrive(sched, rec, pending, now):
        start = now[0]
        out = sched.schedule()
        b = batch_from_output(out)
        jitter = lambda: 1 + noise * rng.standard_normal()  # noqa: E731
        device = device_law(b) * speed * jitter()
        host = (HOST[0] + HOST[1] * b.num_seqs) * jitter()
        now[0] = end = start + device + host
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        outputs = sched.update_from_output(out, ModelRunnerOutput(ids, sampled))
        record_step(rec, out, outputs, start, end, host / 2, device, host / 2)
        now[0] = end + (GAP[0] + GAP[1] * b.num_seqs) * jitter()
    rec.close()


@pytest.fixture(scope="module")
def engine_like(tmp_path_factory):
    root = tmp_path_factory.mktemp("fidelity")
    for i, name in enumerate(("a", "b")):
        record_engine_like(root / name, seed=i)
    return root


def test_mean_law_predicts_the_expected_time_of_each_kind_of_step_with_every_slow_step_kept():
    rng = np.random.default_rng(0)
    n = 2000
    prefill = rng.random(n) < 0.4
    batches = [StepBatch(int(p), int(d), int(p > 0), int(d), int(p + d + c), float(causal_pairs(p, c)))
               for p, d, c in zip(rng.integers(1, 400, n) * prefill, rng.integers(1, 30, n), rng.integers(0, 2000, n))]
    x = part_matrix("device", batches)
    y = x @ np.array([DEVICE[k] for k in DEVICE_TERMS]) * np.exp(0.03 * rng.standard_normal(n))
    y[rng.random(n) < 0.2] *= 4.0  # a fifth of the steps slowed by a neighbour: kept, not dropped
    pred = x @ fit_mean_law(x, y)
    for kind in (prefill, ~prefill):
        assert y[kind].sum() / pred[kind].sum() == pytest.approx(1.0, abs=0.05)
    assert y.sum() / pred.sum() == pytest.approx(1.0, abs=0.02)


def test_calibrate_fits_the_host_phases_and_the_gap_between_steps(engine_like):
    profile, _ = calibrate([traces.load(engine_like / "a"), traces.load(engine_like / "b")])
    host, gap = profile.parts["host"].coefficients, profile.parts["gap"].coefficients
    assert host["h0"] == pytest.approx(HOST[0], rel=0.15) and host["h_seq"] == pytest.approx(HOST[1], rel=0.15)
    assert gap["g0"] == pytest.approx(GAP[0], rel=0.15) and gap["g_seq"] == pytest.approx(GAP[1], rel=0.15)
    assert profile.fit.parts["cycle"].mape < 3
    assert len(profile.residuals.ratios) == sum(t.num_steps for t in profile.traces)


def test_calibrate_on_several_runs_reports_each_run_s_level(engine_like):
    from sim.calibration.calibrate import report_lines

    profile, _ = calibrate([traces.load(engine_like / "a"), traces.load(engine_like / "b")])
    line = next(x for x in report_lines(profile) if x.startswith("run levels"))
    assert len(line.split(":")[1].split(";")[0].split(",")) == 2


def test_calibrate_reports_leave_one_trace_out_per_part(engine_like):
    profile, _ = calibrate([traces.load(engine_like / "a"), traces.load(engine_like / "b")])
    loto = profile.leave_one_trace_out
    assert len(loto) == 2 and all(r.parts[p].mape < 5 for r in loto for p in ("device", "host", "gap"))


def test_residual_blocks_are_runs_of_consecutive_measured_steps_and_repeat_with_the_seed():
    table = residual_table(np.column_stack([np.arange(1, 151) / 100.0] * 3), [150])  # too short to split
    table = table.model_copy(update={"block_steps": 10})
    a, b = ResidualSampler(table, 3), ResidualSampler(table, 3)
    draws = np.array([a.at(i)[0] for i in range(100)])
    assert (draws == np.array([b.at(i)[0] for i in range(100)])).all()
    steps = np.diff(draws.reshape(10, 10), axis=1)
    assert np.allclose(steps, 0.01)
    assert not (draws == np.array([ResidualSampler(table, 4).at(i)[0] for i in range(100)])).all()


def test_a_replay_sampled_from_several_runs_runs_at_one_level_each():
    """Two calibration runs, one twice as slow throughout: a sampled replay is one run, so its steps are
    all at one level (not a mix of blocks of both)."""
    slow_fast = np.column_stack([np.r_[np.full(100, 2.0), np.full(100, 1.0)]] + [np.ones(200)] * 2)
    table = residual_table(slow_fast, [100, 100])
    table = table.model_copy(update={"block_steps": 5})
    for seed in range(20):
        sampler = ResidualSampler(table, seed)
        assert len({float(sampler.at(i)[0]) for i in range(60)}) == 1


def test_sampled_levels_reach_past_the_observed_ones_on_both_sides():
    """Two runs cannot bound the next one: some replays run faster than the faster run, some slower than
    the slower, and half of them either side of the runs' geometric mean."""
    slow_fast = np.column_stack([np.r_[np.full(200, 2.0), np.full(200, 1.0)]] + [np.ones(400)] * 2)
    table = residual_table(slow_fast, [200, 200])
    levels = np.array([float(ResidualSampler(table, seed).at(0)[0]) for seed in range(20)])
    assert (levels < 1.0).any() and (levels > 2.0).any()
    assert abs(int((levels < np.sqrt(2.0)).sum()) - 10) <= 1
    assert levels.max() / levels.min() < 100  # each run's halves are levels too: no Cauchy tails from two runs


def test_one_calibration_run_lends_its_parts_levels_to_sampled_replays():
    """A single run whose machine ran twice as slow in its second half: the drift within it is what the
    intervals must show, so replays run at levels spread around its parts' levels, one level each."""
    drifting = np.column_stack([np.r_[np.full(200, 1.0), np.full(200, 2.0)]] + [np.ones(400)] * 2)
    table = residual_table(drifting, [400])
    table = table.model_copy(update={"block_steps": 5})
    drawn = [{float(ResidualSampler(table, seed).at(i)[0]) for i in range(60)} for seed in range(20)]
    assert all(len(d) == 1 for d in drawn)
    levels = np.array([d.pop() for d in drawn])
    assert (levels < 1.0).any() and (levels > 2.0).any()


def test_level_interval_covers_a_new_run_at_about_its_nominal_rate():
    """The p5-p95 of a new run's level, from 2 to 4 observed runs, holds the next run about 90 % of the time."""
    from sim.cost_models.residuals import level_quantile

    rng = np.random.default_rng(7)
    for k in (2, 3, 4):
        hits = 0
        for _ in range(400):
            runs = np.exp(rng.normal(0.0, 0.2, (k + 1, 3)))
            lo, hi = level_quantile(runs[:k], 0.05), level_quantile(runs[:k], 0.95)
            hits += bool(lo[0] <= runs[k, 0] <= hi[0])
        assert 0.85 <= hits / 400 <= 0.95, (k, hits)


def test_calibration_report_names_the_levels_of_one_run_s_parts(engine_like):
    from sim.calibration.calibrate import report_lines

    profile, _ = calibrate([traces.load(engine_like / "a")])
    drifting = np.column_stack([np.r_[np.full(200, 1.0), np.full(200, 2.0)]] + [np.ones(400)] * 2)
    profile = profile.model_copy(update={"residuals": residual_table(drifting, [400])})  # long enough to split
    line = next(x for x in report_lines(profile) if x.startswith("run levels"))
    assert "per part of the one calibration run" in line and "1.00, 1.00, 2.00, 2.00;" in line


def test_within_run_scatter_rides_on_the_drawn_level():
    run_a = np.column_stack([np.tile([0.5, 1.5], 50)] + [np.ones(100)] * 2)  # level 1.0, scatter +-50 %
    run_b = np.column_stack([np.full(100, 3.0)] + [np.ones(100)] * 2)  # level 3.0, no scatter
    table = residual_table(np.vstack([run_a, run_b]), [100, 100])
    table = table.model_copy(update={"block_steps": 1})
    seen = set()
    for seed in range(40):
        sampler = ResidualSampler(table, seed)
        level = float(predictive_level(np.array([[1.0, 1, 1], [3.0, 1, 1]]), seed)[0])
        seen |= {round(float(sampler.at(i)[0]) / level, 6) for i in range(200)}
    # Within-run ratios: 0.5 and 1.5 (run a), 1.0 (run b), each times the replay's level.
    assert seen == {0.5, 1.0, 1.5}


def test_sampled_interval_covers_held_out_runs_of_a_machine_with_slow_spells():
    """Slow spells (AR(1) log-noise) make a 300-step run's total vary much more than independent noise
    would; the block bootstrap of one measured run still covers fresh runs at about the nominal rate."""
    rng = np.random.default_rng(5)

    def machine(n):
        e = np.zeros(n)
        for i in range(1, n):
            e[i] = 0.95 * e[i - 1] + 0.1 * rng.standard_normal()
        return np.exp(e)

    table = residual_table(np.column_stack([machine(3000)] + [np.ones(3000)] * 2), [3000])
    totals = []
    for seed in range(200):
        s = ResidualSampler(table, seed)
        totals.append(sum(s.at(i)[0] for i in range(300)))
    iv = interval(totals)
    truths = [machine(300).sum() for _ in range(40)]
    assert np.mean([iv["p5"] <= t <= iv["p95"] for t in truths]) >= 0.8


def test_sampled_step_times_scale_the_law_by_measured_ratios():
    prof = CostProfile(coefficients=DEVICE, parts={"device": PartLaw(coefficients=DEVICE, mean_ratio=1.5)},
                       residuals=residual_table(np.array([[2.0, 1.0, 1.0]] * 4), [4]))
    b = StepBatch(num_decode_tokens=4, num_decode_seqs=4, context_tokens=400)
    assert CalibratedCostModel(prof).step_time(b, 0).total == pytest.approx(1.5 * device_law(b))
    assert CalibratedCostModel(prof, seed=0).step_time(b, 0).total == pytest.approx(2.0 * device_law(b))


def test_profile_used_beyond_its_fitted_batch_shapes_warns_in_one_line():
    model = CalibratedCostModel(CostProfile(coefficients=DEVICE, fitted_range={"num_tokens": 100, "num_seqs": 8}),
                                path="p.json")
    model.step_time(StepBatch(num_decode_tokens=8, num_decode_seqs=8), 0)
    assert model.range_warning() is None
    model.step_time(StepBatch(num_prefill_tokens=400, num_prefill_seqs=1), 1)
    warning = model.range_warning()
    assert "\n" not in warning and "num_tokens up to 400 (fitted up to 100)" in warning


def test_retiming_a_trace_from_its_own_step_parts_reproduces_its_metrics(engine_like):
    """The breakdown's baseline: A rebuilt from its own model, host and gap times is A."""
    a = traces.load(engine_like / "b")
    report = compare_traces(a, a)
    for name, m in report["attribution"]["metrics"].items():
        assert m["retiming"] == pytest.approx(0.0, abs=1e-9 * max(1.0, abs(m["a"]))), name
        assert m["step_time"] == m["host_gap"] == m["total"] == 0.0, name


def test_an_instant_keeps_its_place_among_re_timed_steps():
    """Halfway through a step stays halfway through it re-timed; later instants move with the steps."""
    import pandas as pd

    from sim.fidelity.attribution import warp

    steps = pd.DataFrame({"step": [0, 1], "start": [1.0, 2.5], "end": [2.0, 3.0]})
    starts, ends = np.array([1.0, 4.0]), np.array([3.0, 4.5])  # step 0 twice as long, then a longer gap
    got = warp(np.array([0.5, 1.5, 2.25, 2.75, 10.0]), steps, starts, ends)
    assert got == pytest.approx([0.5, 2.0, 3.5, 4.25, 11.5])


def test_compare_plots_writes_ttft_and_itl_qq_plots(engine_like, tmp_path, capsys):
    assert main(["compare", str(engine_like / "a"), str(engine_like / "b"), "--plots", str(tmp_path)]) == 0
    assert (tmp_path / "ttft_qq.png").stat().st_size > 0 and (tmp_path / "itl_qq.png").stat().st_size > 0


def test_replay_samples_report_each_metric_as_median_inside_p5_p95(engine_like, tmp_path, capsys):
    prof = tmp_path / "p.json"
    assert main(["calibrate", str(engine_like / "a"), "-o", str(prof)]) == 0
    capsys.readouterr()
    assert main(["replay", str(engine_like / "b"), "--cost-model", str(prof), "--samples", "4", "--json",
                 "--no-progress", "--trace", str(tmp_path / "replay")]) == 0
    samples = json.loads(capsys.readouterr().out)["samples"]
    assert samples["num_samples"] == 4 and len(samples["metrics"]) == 10
    assert all(m["p5"] <= m["median"] <= m["p95"] for m in samples["metrics"].values())


def test_samples_without_a_calibrated_profile_is_one_line_exit_2(engine_like, capsys):
    assert main(["replay", str(engine_like / "b"), "--samples", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--samples" in err


def test_residual_scaling_lays_measured_ratios_over_another_cost_model():
    from sim.cost_models.residuals import ResidualScaled

    class Flat(FlatCost):
        def num_gpu_blocks(self, block_size, gpu_memory_utilization=0.9, max_num_batched_tokens=8192,
                           kv_cache_memory=None):
            return 7

    table = residual_table(np.array([[2.0, 1.0, 1.0], [0.5, 1.0, 1.0]]), [2])
    table = table.model_copy(update={"block_steps": 2})
    scaled = ResidualScaled(Flat(), table, seed=1)
    times = sorted(scaled.step_time(StepBatch(), i).total for i in range(2))
    assert times == pytest.approx([0.005, 0.02]) and scaled.num_gpu_blocks(16) == 7


def test_plan_samples_without_residuals_is_one_line_exit_2(capsys):
    from workloads import DEFAULT_WORKLOAD

    assert main(["plan", str(DEFAULT_WORKLOAD), "--slo", "ttft_p99=2s", "--samples", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--residuals" in err


def _fidelity_bench():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fidelity_bench", Path(__file__).parents[1] / "bench" / "fidelity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_fidelity_bench_replay_only_predicts_again_from_the_runs_it_recorded_before(engine_like, tmp_path, monkeypatch):
    """Two model versions compared on the same recordings: no new run is recorded."""
    import shutil

    from traces.summary import summarize

    bench = _fidelity_bench()
    monkeypatch.setattr(bench, "record", lambda *a, **k: pytest.fail("recorded again"))
    shutil.copytree(engine_like / "a", tmp_path / "train")
    shutil.copytree(engine_like / "b", tmp_path / "heldout")
    result = bench.one_repeat(tmp_path, samples=2, together=True, rerecord=False)
    measured = summarize(traces.load(engine_like / "b").requests)
    assert len(result) == 10 and result["ttft_p90"]["measured"] == measured["ttft_p90_s"]
    assert (tmp_path / "profile.json").is_file()


def test_fidelity_bench_pools_every_repeats_training_run_into_one_profile(engine_like, tmp_path):
    import shutil

    bench = _fidelity_bench()
    repeats = [tmp_path / "repeat0", tmp_path / "repeat1"]
    for r, train in zip(repeats, ("a", "b")):
        shutil.copytree(engine_like / train, r / "train")
        shutil.copytree(engine_like / "b", r / "heldout")
    results = bench.pooled(repeats, samples=2, out=tmp_path)
    profile = json.loads((tmp_path / "pooled_profile.json").read_text())
    assert len(profile["traces"]) == 2 and len(results) == 2
    assert all(len(r) == 10 and (rep / "predicted_pooled").is_dir() for r, rep in zip(results, repeats))


def test_same_shape_steps_read_the_machine_s_change_between_runs_of_different_workloads(tmp_path):
    record_engine_like(tmp_path / "slow", seed=7, num_requests=80, speed=1.0)
    record_engine_like(tmp_path / "fast", seed=8, num_requests=60, speed=0.8)
    shift = same_shape_speed(traces.load(tmp_path / "slow"), traces.load(tmp_path / "fast"))
    assert shift is not None and shift.shapes >= 2
    assert shift.ratio == pytest.approx(0.8, rel=0.03)


def test_same_shape_speed_is_none_when_no_shape_ran_often_enough_in_both(engine_like):
    a, b = traces.load(engine_like / "a"), traces.load(engine_like / "b")
    assert same_shape_speed(a, b, min_steps=10**6) is None


def test_compare_reads_two_runs_of_one_machine_as_the_same_speed(engine_like):
    report = compare_traces(traces.load(engine_like / "a"), traces.load(engine_like / "b"))
    assert report["same_shape_speed"]["ratio"] == pytest.approx(1.0, abs=0.03)
    assert "device time on same-shape decode steps, B / A: " in format_report(report)


def test_compare_with_a_trace_kept_without_decisions_reports_no_same_shape_speed(engine_like, tmp_path):
    record_engine_like(tmp_path / "steps_only", seed=1, trace_level="steps")
    report = compare_traces(traces.load(engine_like / "a"), traces.load(tmp_path / "steps_only"))
    assert report["same_shape_speed"] is None
