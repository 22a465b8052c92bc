"""Cost models: NNLS calibration from traces (`sim calibrate`) and the roofline with its hardware table."""
import itertools
import json

import numpy as np
import pytest
from core_helpers import fake_output, make_requests, make_scheduler

import traces
from engine.core.model_shapes import PRESET_NAMES, get_model_config
from sim.cost_models.deployment import Deployment
from sim.cost_models.base import StepTiming
from sim.cost_models.batch import StepBatch, batch_from_output
from sim.calibration.calibrate import batches_from_trace, calibrate
from sim.cli import main as sim_main
from sim.cost_models.calibrated import CalibratedCostModel, nnls
from sim.cost_models.profile import CostProfile, load_profile
from sim.cost_models.hardware import get_hardware
from sim.cost_models.kernels import KernelSumCostModel
from sim.cost_models.roofline import RooflineCostModel, model_shape
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from recording import record_step

TRUE = {"c0": 2e-3, "c_p": 5e-5, "c_d": 2e-4, "c_ctx": 1e-6, "c_attn": 1e-7, "c_seq": 1e-4, "c_pseq": 1e-3}
META = {"source": "engine", "device": {"type": "cpu", "name": "test-cpu"},
        "config": {"model": {"model": "builtin", "architecture": "Qwen3ForCausalLM", "dtype": "float32",
                             "hf_config": get_model_config("builtin")}}}


def law(b: StepBatch) -> float:
    return (TRUE["c0"] + TRUE["c_p"] * b.num_prefill_tokens + TRUE["c_d"] * b.num_decode_tokens
            + TRUE["c_ctx"] * b.context_tokens + TRUE["c_attn"] * b.prefill_attention + TRUE["c_seq"] * b.num_seqs
            + TRUE["c_pseq"] * b.num_prefill_seqs)


def record(path, seed=0, noise=0.02, spike_every=0, num_requests=30):
    """A trace of the real scheduler + fake runner whose step times follow `law` (times noise; with
    `spike_every`, some steps 10x too slow and some 50x too fast); returns the live (batch, time) pairs."""
    rng = np.random.default_rng(seed)
    sched = make_scheduler(max_num_seqs=8, max_num_batched_tokens=256, num_blocks=4000)
    rec = TraceRecorder(TraceWriter(path, META), sched)
    pending = [make_requests(1, num_tokens=int(rng.integers(20, 600)), max_tokens=int(rng.integers(4, 40)),
                             ignore_eos=True, start=i)[0] for i in range(num_requests)]
    t, k, live = 0.0, 0, []
    while pending or sched.has_unfinished_requests():
        if pending and k % 3 == 0:
            req = pending.pop(0)
            sched.add_request(req)
            rec.on_add(req)
        out = sched.schedule()
        batch = batch_from_output(out)
        outputs = sched.update_from_output(out, fake_output(out, sched))
        dt = law(batch) * (1 + noise * rng.standard_normal()) if batch.num_tokens else 1e-4
        if spike_every and k % spike_every == spike_every - 1:
            dt *= 10 if (k // spike_every) % 2 else 0.02
        record_step(rec, out, outputs, t, t + dt)
        t, k = t + dt, k + 1
        if batch.num_tokens:
            live.append((batch, dt))
    rec.close()
    return live


@pytest.fixture(scope="module")
def two_traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    record(root / "a", seed=0)
    record(root / "b", seed=1)
    return [str(root / "a"), str(root / "b")]


def _brute_nnls(a, b):
    best = None
    for k in range(a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x = np.zeros(a.shape[1])
            if cols:
                x[list(cols)] = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)[0]
            r = np.linalg.norm(a @ x - b)
            if (x >= -1e-12).all() and (best is None or r < best[0] - 1e-12):
                best = (r, x)
    return best[1]


def test_nnls_recovers_known_nonnegative_coefficients():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 10, size=(200, 6))
    truth = np.array([3.0, 0.5, 0.0, 2.0, 1e-3, 7.0])
    assert np.allclose(nnls(a, a @ truth), truth, atol=1e-9)


def test_nnls_matches_the_exhaustive_solution_on_random_problems():
    rng = np.random.default_rng(1)
    for _ in range(50):
        a, b = rng.normal(size=(15, 4)), rng.normal(size=15)
        assert np.allclose(nnls(a, b), _brute_nnls(a, b), atol=1e-8)


def test_negative_true_coefficient_is_clamped_to_zero():
    rng = np.random.default_rng(2)
    a = np.column_stack([np.ones(300), rng.uniform(0, 100, size=(300, 2))])
    b = a @ np.array([5.0, -0.02, 0.3]) + rng.normal(0, 0.1, 300)
    x = nnls(a, b)
    assert x[1] == 0.0 and (x >= 0).all() and np.allclose(x, _brute_nnls(a, b), atol=1e-8)


def test_batches_rebuilt_from_a_trace_equal_the_scheduler_batches(tmp_path):
    live = record(tmp_path)
    rebuilt = batches_from_trace(traces.load(tmp_path))
    assert [b for b, _ in rebuilt] == [b for b, _ in live]
    assert np.allclose([d for _, d in rebuilt], [d for _, d in live])


def test_fit_on_traces_recovers_the_step_time_law(two_traces):
    profile, _ = calibrate([traces.load(p) for p in two_traces])
    c = profile.coefficients
    for k in ("c0", "c_p", "c_ctx", "c_attn"):
        assert c[k] == pytest.approx(TRUE[k], rel=0.1), k
    # Decode tokens and sequences move together in decode steps; their sum is what is pinned down, and
    # with it what a prefill sequence costs beyond a decoding one.
    assert c["c_d"] + c["c_seq"] == pytest.approx(TRUE["c_d"] + TRUE["c_seq"], rel=0.1)
    assert c["c_pseq"] - c["c_d"] == pytest.approx(TRUE["c_pseq"] - TRUE["c_d"], rel=0.1)
    assert profile.fit.mape < 3 and profile.fit.r2 > 0.99
    assert len(profile.leave_one_trace_out) == 2 and all(r.mape < 4 for r in profile.leave_one_trace_out)


def test_profile_round_trips_through_json_and_predicts_the_same(two_traces, tmp_path):
    out = tmp_path / "profile.json"
    assert sim_main(["calibrate", *two_traces, "-o", str(out)]) == 0
    profile, _ = calibrate([traces.load(p) for p in two_traces])
    loaded = CalibratedCostModel.load(out)
    fresh = CalibratedCostModel(profile)
    batches = [b for b, _ in batches_from_trace(traces.load(two_traces[0]))]
    assert [loaded.step_time(b, 0) for b in batches] == [fresh.step_time(b, 0) for b in batches]
    info = loaded.describe()
    assert (info.model, info.fitted_model["model"], info.hardware) == ("builtin", "builtin", "test-cpu")
    d = info.to_meta()
    assert d["coefficients"] == profile.coefficients and d["model"]["model"] == "builtin"
    assert d["traces"] == [str(traces.load(p).path) for p in two_traces]


def test_sim_calibrate_writes_a_profile_and_prints_the_fit_error(two_traces, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert sim_main(["calibrate", *two_traces, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fit error device: MAPE" in printed and "fit error gap:" in printed and "leave-one-trace-out" in printed
    prof = load_profile(out)
    assert prof.device["name"] == "test-cpu" and len(prof.traces) == 2 and prof.fit.num_steps > 100


def test_sim_calibrate_rejects_a_directory_that_is_not_a_trace(tmp_path, capsys):
    (tmp_path / "not_a_trace").mkdir()
    assert sim_main(["calibrate", str(tmp_path / "not_a_trace"), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "not_a_trace") in err and "not a trace directory" in err
    assert not (tmp_path / "p.json").exists()


def test_sim_calibrate_rejects_a_trace_without_steps(tmp_path, capsys):
    TraceWriter(tmp_path / "empty", META).close()
    assert sim_main(["calibrate", str(tmp_path / "empty"), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no steps" in err


def test_sim_calibrate_without_output_is_a_one_line_error(two_traces, capsys):
    assert sim_main(["calibrate", *two_traces]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--output" in err


@pytest.mark.parametrize("content, field", [("{", "not valid JSON"), ('{"kind": "x"}', "kind"),
                                             ("NEG", "coefficients.c_p")])
def test_load_profile_names_what_is_wrong(tmp_path, content, field):
    if content == "NEG":
        content = json.dumps({"kind": "stepscope-cost-profile", "format_version": 1,
                              "coefficients": {**TRUE, "c_p": -1.0}})
    (tmp_path / "p.json").write_text(content)
    with pytest.raises(ValueError, match=field):
        CalibratedCostModel.load(tmp_path / "p.json")


def test_load_profile_names_every_wrong_field_in_one_line(tmp_path):
    bad = {"kind": "stepscope-cost-profile", "format_version": 3, "coefficients": {**TRUE, "c_p": "x", "c_seq": -2},
           "parts": {"device": {"mean_ratio": 1.0}}, "residuals": {"ratios": [[1.0, 1.0, 1.0]], "block_steps": 0}}
    (tmp_path / "p.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError) as e:
        load_profile(tmp_path / "p.json")
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "p.json"))
    for field in ("coefficients.c_p", "coefficients.c_seq", "parts.device.coefficients", "residuals.block_steps"):
        assert field in message


def test_a_profile_from_before_the_prefill_sequence_term_loads_and_charges_none(tmp_path):
    older = {k: v for k, v in TRUE.items() if k != "c_pseq"}
    laws = {"device": {"coefficients": older, "mean_ratio": 1.0}}
    (tmp_path / "p.json").write_text(json.dumps({"kind": "stepscope-cost-profile", "format_version": 2,
                                                 "coefficients": older, "parts": laws}))
    model = CalibratedCostModel.load(tmp_path / "p.json")
    b = StepBatch(num_prefill_tokens=100, num_decode_tokens=3, num_prefill_seqs=2, num_decode_seqs=3,
                  context_tokens=400, prefill_attention=5000.0)
    assert model.coefficients["c_pseq"] == 0.0
    assert model.step_time(b, 0).device == pytest.approx(law(b) - TRUE["c_pseq"] * 2)


def test_calibrated_model_warns_when_a_run_uses_another_model():
    model = CalibratedCostModel(CostProfile(coefficients=TRUE, model={"model": "builtin"}, device={"type": "cpu"}))
    other = {"config": {"model": {"model": "llama-3.1-8b"}}, "device": {"type": "cuda"}}
    warnings = model.mismatches(other)
    assert len(warnings) == 2 and "llama-3.1-8b" in warnings[0]
    assert model.mismatches({"config": {"model": {"model": "builtin"}}, "device": {"type": "cpu"}}) == []


def _batch(*seqs):
    b = StepBatch()
    for num_tokens, computed, decode in seqs:
        b.add(num_tokens, computed, decode)
    return b


def test_a_single_decode_costs_its_weights_at_the_fitted_bandwidth_plus_a_floor_per_kernel():
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h200")
    hw, shape = model.hardware, model.shape
    parts = model.breakdown(_batch((1, 100, True)))
    kernels = shape.num_layers * (2 + 4 + 2) + 2 + 2  # norms, GEMMs, rotary+act per layer; step ops; LM head+sampler
    expected = (shape.weight_read_bytes(1) / (4.8e12 * hw.bw_eff) + kernels * hw.kernel_floor
                + shape.num_layers * hw.attn_floor)
    assert sum(parts.values()) == pytest.approx(expected, rel=0.03)
    assert model.step_time(_batch((1, 100, True)), 0).total == pytest.approx(sum(parts.values()))


def test_a_large_prefill_gemm_is_bound_by_its_flops_at_the_fitted_share_of_peak():
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h200")
    hw, s = model.hardware, model.shape
    flops = 2.0 * 8192 * (2 * s.intermediate) * s.hidden
    assert model.timer.dense("gate_up_proj", 8192) == pytest.approx(flops / (hw.peak_flops * hw.mfu_eff)
                                                                     + hw.kernel_floor)


def test_step_time_grows_with_context_tokens():
    model = RooflineCostModel.from_args(model="qwen2.5-7b", hardware="a100")
    times = [model.step_time(_batch(*[(1, ctx, True)] * 64), 0).total for ctx in (100, 1000, 10_000)]
    assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("model,hardware,tp,async_scheduling", [
    ("llama-3.1-8b", "h200", 1, True), ("qwen3-0.6b", "l4", 1, False), ("qwen2.5-7b", "a100", 2, True),
    ("llama-3.1-8b", "h100", 2, False)])
def test_decode_step_times_are_step_time_of_each_decode_step_to_the_bit(model, hardware, tp, async_scheduling):
    """A run of decode steps timed at once, each of its steps timed alone, and the kernel sum's general
    path (prefill chunks, skew) on the same batches all agree to the bit."""
    one_by_one, at_once, general = (RooflineCostModel.from_args(model=model, hardware=hardware, deployment=Deployment(tensor_parallel_size=tp),
                                                                async_scheduling=async_scheduling) for _ in range(3))
    for n, context in [(1, 5), (7, 12_345), (4, 1_002), (256, 3_000_000)]:  # 1002 / 4: a tie, rounded to even
        expected = [one_by_one.step_time(StepBatch(0, n, 0, n, context + n * j, 0.0), j) for j in range(200)]
        assert expected == [KernelSumCostModel.step_time(general, StepBatch(0, n, 0, n, context + n * j, 0.0), j)
                            for j in range(200)]
        times = at_once.decode_step_times(n, context, 200)
        assert [StepTiming(device, times.host) for device in times.device] == expected
        assert times.totals() == [t.total for t in expected]
    assert (at_once.num_steps, at_once.steps_outside) == (one_by_one.num_steps, one_by_one.steps_outside)


def test_h100_is_slower_than_h200_for_decode():
    batch = _batch(*[(1, 500, True)] * 32)
    h100, h200 = (RooflineCostModel.from_args(model="llama-3.1-8b", hardware=h) for h in ("h100", "h200"))
    assert h100.step_time(batch, 0).total > h200.step_time(batch, 0).total


def test_unknown_hardware_is_a_clear_error_listing_valid_names():
    with pytest.raises(ValueError, match="unknown hardware 'tpu9'.*h100.*h200") as e:
        RooflineCostModel.from_args(model="llama-3.1-8b", hardware="tpu9")
    assert "a100" in str(e.value) and "l4" in str(e.value)
    with pytest.raises(ValueError, match="calibration profile"):
        RooflineCostModel.from_args(model="llama-3.1-8b", hardware="cpu")


def test_num_gpu_blocks_is_positive_and_shrinks_with_model_size():
    blocks = [RooflineCostModel.from_args(model=m, hardware="h100").num_gpu_blocks(16, 0.9)
              for m in ("builtin", "qwen3-0.6b", "llama-3.1-8b")]
    assert blocks[0] > blocks[1] > blocks[2] > 0
    assert RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100").num_gpu_blocks(16, 0.5) < blocks[2]


@pytest.mark.parametrize("name, billions", [("qwen3-0.6b", 0.596), ("llama-3.1-8b", 8.03), ("qwen2.5-7b", 7.62)])
def test_model_shapes_have_the_published_parameter_counts(name, billions):
    assert model_shape(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_hf_config_dict_gives_the_same_shape_as_the_preset():
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    assert model_shape(cfg).total_params == model_shape("llama-3.1-8b").total_params
    assert model_shape(cfg).kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_roofline_from_a_profile_uses_the_measured_rates(two_traces, tmp_path):
    out = tmp_path / "p.json"
    assert sim_main(["calibrate", *two_traces, "-o", str(out)]) == 0
    prof = load_profile(out)
    model = RooflineCostModel.from_args(hardware="cpu", profile=out)
    hw, c, shape = model.hardware, prof.coefficients, model.shape
    assert hw.effective_flops == pytest.approx(prof.effective["flops"])
    assert hw.effective_flops >= 2 * shape.active_params / c["c_p"] * (1 - 1e-9)
    assert hw.effective_bandwidth >= shape.kv_bytes_per_token / c["c_ctx"] * (1 - 1e-9)
    assert 0 <= hw.step_overhead <= c["c0"] and shape.dtype == "float32"
    assert "calibration profile" in model.describe().meta["source"] and model.num_gpu_blocks(16) > 0


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_roofline_context_length_is_the_presets(name):
    assert RooflineCostModel(model_shape(name), get_hardware("h200")).max_model_len == \
        get_model_config(name)["max_position_embeddings"]


def test_llama_3_1_8b_roofline_addresses_131072_positions():
    assert model_shape("llama-3.1-8b").max_positions == 131072


def test_recorded_step_time_starts_when_the_step_before_it_ended():
    """Async scheduling schedules step k+1 before step k ends; its device time starts at that end."""
    import numpy as np

    from sim.cost_models.recorded import RecordedCostModel

    model = RecordedCostModel(np.array([0.0, 1.0, 3.5]), np.array([2.0, 3.0, 4.0]))
    assert [model.step_time(None, i).total for i in range(3)] == [2.0, 1.0, 0.5]
