"""Per-kernel cost models: a measured profile bundle read and interpolated, the kernel sum over one rank's
kernels with the all-reduces that join the ranks, and the roofline on every GPU of the table (the shapes
and GPUs they price from: tests/test_model_shapes_and_hardware.py).

Every bundle here is synthetic, written into tmp_path with values chosen so that expected times can be
worked out by hand: on the grid's token axes the log1p coordinates of 15, 63 and 255 are log 16, log 64
and log 256, so log-log interpolation halfway (63 between 15 and 255) is the geometric mean.
"""
import math
import re

import pytest

from sim.cost_models.batch import StepBatch
from sim.cli import main
from sim.cost_models import get_cost_model
from sim.cost_models.deployment import Deployment
from sim.cost_models.hardware import GB, HARDWARE, Hardware, get_hardware
from sim.cost_models.kernel_models import bundle_model
from sim.cost_models.kernels import DENSE_OPS, AttentionShape, KernelSumCostModel, attention_shapes
from sim.cost_models.profile_bundle import BundleError, ProfileKernels
from sim.cost_models.roofline import RooflineCostModel
from sim_helpers import TINY_WORKLOAD, one_line

# Dense and per-sequence tables: microseconds at 1, 15 and 255 tokens (sequences), times a per-op factor.
TOKEN_POINTS = ((1, 2.0), (15, 4.0), (255, 16.0))
OP_FACTOR = {op: i + 1 for i, op in enumerate(DENSE_OPS)}
SEQ_FACTOR = {"lm_head": 20, "sampler": 3}
# Attention grid: a full product of these keys.
PC, KVP, ND, KVD = (0, 15, 255), (0, 255), (0, 1, 7), (0, 15, 255)

SKEW_META = {
    "enabled": True,
    "bucket_axes": {
        "n_bins": [0, 2, 4, 8, 1000000], "n_labels": ["n<=2", "n<=4", "n<=8", "n>8"],
        "skew_rate_bins": [-0.01, 0.05, 0.15, 0.4, 0.7, 1.01],
        "skew_rate_labels": ["sr<=5%", "sr<=15%", "sr<=40%", "sr<=70%", "sr>70%"],
        "kv_big_bins": [0, 1024, 1000000000], "kv_big_labels": ["kvB<=1k", "kvB>1k"],
        "kp_bins": [-1, 0, 1000000000], "kp_labels": ["kp=0", "kp>0"]},
    "per_tp": {1: {"alpha_default": 0.1}},
}
# Two decodes at 32 and 224 tokens: mean 128, ratio (128 - 32) / (224 - 32) = 0.5 -> "sr<=70%".
SKEW_CSV = "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n0,n<=2,sr<=70%,kvB<=1k,kp=0,0.5,4\n"

def attention_us(pc: int, kvp: int, nd: int, kvd: int) -> float:
    """The synthetic attention time: positive, and increasing along every axis (along kvd where nd > 0)."""
    return 4.0 + 0.05 * pc + 0.01 * kvp + 0.5 * nd + 0.002 * nd * kvd


def write_bundle(root, *, architecture="qwen3", hardware="H100", tps=(1,), skew=False, meta=True):
    root.mkdir(parents=True, exist_ok=True)
    if meta:
        lines = [f"architecture: {architecture}", f"hardware: {hardware}", "model: synthetic", "variant: bf16"]
        text = "\n".join(lines) + "\n"
        if skew:
            import yaml

            text += yaml.safe_dump({"skew_fit": SKEW_META})
        (root / "meta.yaml").write_text(text)
    for tp in tps:
        d = root / f"tp{tp}"
        d.mkdir()
        dense = ["layer,tokens,time_us"] + [f"{op},{n},{t * k}" for op, k in OP_FACTOR.items()
                                            for n, t in TOKEN_POINTS]
        (d / "dense.csv").write_text("\n".join(dense) + "\n")
        seq = ["layer,sequences,time_us"] + [f"{op},{n},{t * k}" for op, k in SEQ_FACTOR.items()
                                             for n, t in TOKEN_POINTS]
        (d / "per_sequence.csv").write_text("\n".join(seq) + "\n")
        att = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"] + [
            f"{p},{k},{n},{c},{attention_us(p, k, n, c)}" for p in PC for k in KVP for n in ND for c in KVD]
        (d / "attention.csv").write_text("\n".join(att) + "\n")
        if skew:
            (d / "skew_fit.csv").write_text(SKEW_CSV)
    return root


@pytest.fixture
def bundle(tmp_path):
    return write_bundle(tmp_path / "bundle")


def _batch(*seqs):
    b = StepBatch()
    for num_tokens, computed, decode in seqs:
        b.add(num_tokens, computed, decode)
    return b


# --- bundle interpolation ---------------------------------------------------------------------------------

def test_a_dense_kernel_at_a_grid_point_is_the_measured_time(bundle):
    kernels = ProfileKernels(bundle)
    k = OP_FACTOR["gate_up_proj"]
    for tokens, us in TOKEN_POINTS:
        assert kernels.dense("gate_up_proj", tokens) == pytest.approx(us * k * 1e-6, rel=1e-12)
    assert kernels.outside == 0


def test_a_dense_kernel_between_grid_points_is_interpolated_in_log_log_space(bundle):
    kernels = ProfileKernels(bundle)
    k = OP_FACTOR["o_proj"]
    # log(1 + 63) lies halfway between log(1 + 15) and log(1 + 255): the geometric mean of 4 and 16 us.
    assert kernels.dense("o_proj", 63) == pytest.approx(math.sqrt(4.0 * 16.0) * k * 1e-6, rel=1e-12)
    # A quarter of the way (log 32 between log 16 and log 256): 4 * (16 / 4) ** 0.25 us.
    assert kernels.dense("o_proj", 31) == pytest.approx(4.0 * 4.0 ** 0.25 * k * 1e-6, rel=1e-12)
    assert kernels.per_sequence("lm_head", 63) == pytest.approx(8.0 * SEQ_FACTOR["lm_head"] * 1e-6, rel=1e-12)
    assert kernels.outside == 0


def test_past_the_last_token_count_time_grows_in_proportion_and_counts_as_outside(bundle):
    kernels = ProfileKernels(bundle)
    k = OP_FACTOR["down_proj"]
    assert kernels.dense("down_proj", 510) == pytest.approx(2 * 16.0 * k * 1e-6, rel=1e-12)
    assert kernels.dense("down_proj", 2550) == pytest.approx(10 * 16.0 * k * 1e-6, rel=1e-12)
    assert kernels.outside == 2


def test_attention_at_a_measured_4d_point_is_the_measured_time(bundle):
    kernels = ProfileKernels(bundle)
    for point in ((15, 255, 7, 15), (0, 0, 1, 255), (255, 0, 7, 255), (15, 0, 0, 0)):
        assert kernels.attention(AttentionShape(*point)) == pytest.approx(attention_us(*point) * 1e-6, rel=1e-12)
    assert kernels.outside == 0


def test_attention_between_grid_points_lies_between_its_neighbours(bundle):
    kernels = ProfileKernels(bundle)
    # Along one axis, halfway in log1p: the geometric mean of the two neighbours.
    mid = kernels.attention(AttentionShape(0, 0, 1, 63))
    assert mid == pytest.approx(math.sqrt(attention_us(0, 0, 1, 15) * attention_us(0, 0, 1, 255)) * 1e-6, rel=1e-12)
    # Between points on three axes at once: strictly inside the range of the eight surrounding corners.
    t = kernels.attention(AttentionShape(100, 0, 4, 100))
    corners = [attention_us(p, 0, n, c) * 1e-6 for p in (15, 255) for n in (1, 7) for c in (15, 255)]
    assert min(corners) < t < max(corners)
    assert kernels.outside == 0


# --- out-of-grid warning ----------------------------------------------------------------------------------

def test_steps_beyond_the_grid_make_range_warning_name_their_count(bundle):
    model = bundle_model(bundle, "qwen3-0.6b", None, Deployment(), True)
    model.step_time(_batch((600, 0, False)), 0)           # 600 tokens: past the 255 measured
    model.step_time(_batch((1, 20, True), (1, 40, True)), 1)   # inside
    model.step_time(_batch((1, 1000, True)), 2)            # a decode context past the 255 measured
    warning = model.range_warning()
    assert warning is not None and warning.startswith("2 of 3 steps fell outside the profiled grid")
    assert str(bundle) in warning


def test_a_step_inside_the_grid_gives_no_range_warning(bundle):
    model = bundle_model(bundle, "qwen3-0.6b", None, Deployment(), True)
    model.step_time(_batch((1, 20, True), (1, 40, True)), 0)
    model.step_time(_batch((10, 100, False), (1, 40, True)), 1)
    assert model.range_warning() is None


def test_sim_replay_beyond_the_grid_warns_once_on_stderr_and_succeeds(tmp_path, bundle, capsys):
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    rc = main(["replay", str(workload), "--cost-model", str(bundle), "--model", "qwen3-0.6b",
               "--trace", str(tmp_path / "t"), "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    m = re.search(r"sim replay: warning: (\d+) of (\d+) steps fell outside the profiled grid", warnings[0])
    assert m is not None and 1 <= int(m.group(1)) <= int(m.group(2))
    assert "cost model: profile;" in captured.out


# --- bad bundles ------------------------------------------------------------------------------------------

def _break(root, kind):
    """A bundle damaged in one way, with what its error must name and the --tensor-parallel-size to ask."""
    write_bundle(root, meta=kind != "no_meta")
    dense = root / "tp1" / "dense.csv"
    if kind == "no_meta":
        return 1, [str(root), "meta.yaml"]
    if kind == "tp_not_profiled":
        return 2, [str(root), "tp2", "profiled tensor-parallel sizes: 1"]
    lines = dense.read_text().splitlines()
    if kind == "missing_column":
        dense.write_text("\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n")
        return 1, [str(dense), "missing column 'time_us'"]
    op, tokens, _ = lines[2].split(",")
    lines[2] = f"{op},{tokens},{'fast' if kind == 'non_numeric' else '-1.5'}"
    dense.write_text("\n".join(lines) + "\n")
    return 1, [str(dense), "row 3", "time_us", "'fast'" if kind == "non_numeric" else "-1.5"]


BAD = ("no_meta", "tp_not_profiled", "missing_column", "non_numeric", "negative")


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_bundle_is_a_one_line_error_naming_file_row_and_field(tmp_path, kind):
    tp, names = _break(tmp_path / "bad", kind)
    with pytest.raises(BundleError) as e:
        get_cost_model(str(tmp_path / "bad"), model="qwen3-0.6b", deployment=Deployment(tensor_parallel_size=tp))
    text = one_line(e.value)
    for name in names:
        assert name in text


@pytest.mark.parametrize("kind", BAD)
def test_sim_replay_with_a_bad_bundle_exits_2_withone_line(tmp_path, kind, capsys):
    tp, names = _break(tmp_path / "bad", kind)
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY_WORKLOAD)
    rc = main(["replay", str(workload), "--cost-model", str(tmp_path / "bad"), "--model", "qwen3-0.6b",
               "--tensor-parallel-size", str(tp), "--trace", str(tmp_path / "t"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("sim replay: error: ") and all(name in err for name in names)


def test_a_negative_attention_coordinate_is_refused_saying_zero_is_allowed(tmp_path):
    root = write_bundle(tmp_path / "b")
    path = root / "tp1" / "attention.csv"
    lines = path.read_text().splitlines()
    lines[2] = "0,0,0,-5,4.0"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BundleError) as e:
        ProfileKernels(root)
    text = one_line(e.value)
    # kv_decode 0 is a valid grid key (the bundles' rows without decodes): the bound is >= 0, not > 0.
    assert str(path) in text and "row 3" in text and "kv_decode must be >= 0" in text


@pytest.mark.parametrize("alpha", ["nan", "inf"])
def test_a_non_finite_skew_alpha_is_a_one_line_bundle_error(tmp_path, alpha):
    root = write_bundle(tmp_path / "b", skew=True)
    path = root / "tp1" / "skew_fit.csv"
    path.write_text(SKEW_CSV.replace(",0.5,", f",{alpha},"))
    with pytest.raises(BundleError) as e:
        ProfileKernels(root)
    text = one_line(e.value)
    assert str(path) in text and "row 2" in text and "alpha" in text


def test_a_llama_bundle_is_refused_for_a_qwen3_model(tmp_path):
    path = write_bundle(tmp_path / "llama", architecture="llama")
    with pytest.raises(ValueError, match="llama.*qwen3") as e:
        get_cost_model(str(path), model="qwen3-0.6b")
    assert str(path) in one_line(e.value)


def test_a_bundle_from_a_gpu_outside_the_table_needs_hardware(tmp_path):
    path = write_bundle(tmp_path / "b", hardware="TPU9")
    with pytest.raises(ValueError, match="TPU9.*--hardware"):
        get_cost_model(str(path), model="qwen3-0.6b")
    assert get_cost_model(str(path), model="qwen3-0.6b", hardware="h200").hardware.name == "h200"


# --- the all-reduce term ----------------------------------------------------------------------------------

MIXED = ((100, 0, False), (1, 300, True), (1, 500, True))  # 102 tokens, 3 sequences


def test_one_gpu_pays_no_all_reduce():
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100")
    assert model.breakdown(_batch(*MIXED))["all_reduce"] == 0.0
    assert model.all_reduce(4096) == 0.0


def test_tp2_pays_two_all_reduces_per_layer_and_one_more_priced_on_the_link():
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100", deployment=Deployment(tensor_parallel_size=2))
    assert model.timer.all_reduce_time(1e6, 2) is None  # the roofline measures none: the link prices them
    hw, layers = model.hardware, model.shape.num_layers
    expected = (2 * layers + 1) * hw.all_reduce_time(102 * model.shape.hidden * 2, 2)
    assert expected > 0
    assert model.breakdown(_batch(*MIXED))["all_reduce"] == pytest.approx(expected, rel=1e-12)


def test_a_bundle_tp2_step_reads_the_tp2_tables_and_adds_the_link_s_all_reduces(tmp_path):
    path = write_bundle(tmp_path / "b", tps=(1, 2))
    model = get_cost_model(str(path), model="qwen3-0.6b", deployment=Deployment(tensor_parallel_size=2))
    assert model.timer.tp == 2 and model.rank.num_heads == 8
    layers, hidden = model.shape.num_layers, model.shape.hidden
    expected = (2 * layers + 1) * model.hardware.all_reduce_time(102 * hidden * 2, 2)
    assert model.breakdown(_batch(*MIXED))["all_reduce"] == pytest.approx(expected, rel=1e-12)


def test_all_reduce_time_is_the_ring_formula():
    hw = Hardware("x", 1e15, 1e12, None, link_bandwidth=100 * GB, link_latency=5e-6, all_reduce_eff=0.5)
    # tp 4: 2 * 3 = 6 hops; latency 6 * 5 us; bandwidth 6/4 of 1 MB at 50 GB/s = 30 us.
    assert hw.all_reduce_time(1e6, 4) == pytest.approx(60e-6, rel=1e-12)
    latency_only = Hardware("x", 1e15, 1e12, None, link_bandwidth=1e30, link_latency=5e-6, all_reduce_eff=0.5)
    assert latency_only.all_reduce_time(1e6, 4) == pytest.approx(30e-6, rel=1e-9)
    bandwidth_only = Hardware("x", 1e15, 1e12, None, link_bandwidth=100 * GB, link_latency=0.0, all_reduce_eff=0.5)
    assert bandwidth_only.all_reduce_time(1e6, 4) == pytest.approx(30e-6, rel=1e-12)
    assert bandwidth_only.all_reduce_time(1e6, 2) == pytest.approx(20e-6, rel=1e-12)  # 2 hops, 1/2 each
    assert hw.all_reduce_time(1e6, 1) == 0.0 and hw.all_reduce_time(0, 4) == 0.0


def test_all_reduce_time_grows_with_tp():
    hw = get_hardware("h100")
    times = [hw.all_reduce_time(4 << 20, tp) for tp in (1, 2, 4, 8)]
    assert times[0] == 0.0 and times[0] < times[1] < times[2] < times[3]


# --- the sum ----------------------------------------------------------------------------------------------

def _kernel_sum_model(kind, bundle, async_scheduling):
    if kind == "bundle":
        return bundle_model(bundle, "qwen3-0.6b", None, Deployment(), async_scheduling)
    return RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100", deployment=Deployment(tensor_parallel_size=2), async_scheduling=async_scheduling)


@pytest.mark.parametrize("kind", ["bundle", "roofline-tp2"])
def test_async_step_time_is_the_sum_of_the_breakdown_with_no_host_term(bundle, kind):
    model = _kernel_sum_model(kind, bundle, True)
    batch = _batch((200, 50, False), (100, 0, False), (1, 100, True), (1, 200, True))
    parts = model.breakdown(batch)
    assert parts["host"] == 0.0
    assert model.step_time(batch, 0).total == pytest.approx(sum(parts.values()), rel=1e-12)


@pytest.mark.parametrize("kind", ["bundle", "roofline-tp2"])
def test_sync_step_time_adds_the_host_term_to_the_device_sum(bundle, kind):
    model = _kernel_sum_model(kind, bundle, False)
    batch = _batch((200, 50, False), (100, 0, False), (1, 100, True), (1, 200, True))
    parts = model.breakdown(batch)
    hw = model.hardware
    assert parts["host"] == pytest.approx(hw.step_overhead + 4 * hw.seq_overhead, rel=1e-12) and parts["host"] > 0
    assert model.step_time(batch, 0).total == pytest.approx(sum(parts.values()), rel=1e-12)
    unhidden = _kernel_sum_model(kind, bundle, True).step_time(batch, 0).total
    assert model.step_time(batch, 0).total - unhidden == pytest.approx(parts["host"], rel=1e-9)


# --- skew -------------------------------------------------------------------------------------------------

def test_decodes_spread_around_their_mean_cost_more_than_decodes_at_the_mean(tmp_path):
    model = bundle_model(write_bundle(tmp_path / "b", skew=True), "qwen3-0.6b", None, Deployment(), True)
    spread = _batch((1, 31, True), (1, 223, True))   # contexts 32 and 224, mean 128
    even = _batch((1, 127, True), (1, 127, True))    # both at 128
    assert spread.context_tokens == even.context_tokens
    assert model.timer.skew_alpha(attention_shapes(spread)[0], 32, 224) == 0.5
    t = model.timer
    gap = t.attention(AttentionShape(0, 0, 2, 224)) - t.attention(AttentionShape(0, 0, 2, 128))
    assert gap > 0
    assert model.step_time(spread, 0).total > model.step_time(even, 0).total
    assert model.step_time(spread, 0).total - model.step_time(even, 0).total == pytest.approx(
        model.shape.num_layers * 0.5 * gap, rel=1e-9)


def test_decodes_all_at_one_context_cost_exactly_the_mean_shape(tmp_path):
    skewed = bundle_model(write_bundle(tmp_path / "s", skew=True), "qwen3-0.6b", None, Deployment(), True)
    plain = bundle_model(write_bundle(tmp_path / "p"), "qwen3-0.6b", None, Deployment(), True)
    even = _batch((1, 127, True), (1, 127, True))
    assert even.decode_context_min == even.decode_context_max == 128
    assert skewed.step_time(even, 0).total == plain.step_time(even, 0).total
    assert skewed.breakdown(even)["attention"] == skewed.shape.num_layers * skewed.timer.attention(
        AttentionShape(0, 0, 2, 128))


# --- mixed batches ----------------------------------------------------------------------------------------

def test_the_largest_prefill_chunk_shares_the_attention_call_with_the_decodes():
    batch = _batch((100, 0, False), (200, 50, False), (1, 99, True), (1, 199, True))
    main_shape, rest = attention_shapes(batch)
    assert main_shape == AttentionShape(prefill_chunk=200, kv_prefill=50, n_decode=2, kv_decode=150)
    assert rest == [AttentionShape(prefill_chunk=100, kv_prefill=0, n_decode=0, kv_decode=0)]


def test_further_prefill_chunks_are_priced_alone_without_a_second_floor(bundle):
    model = bundle_model(bundle, "qwen3-0.6b", None, Deployment(), True)
    batch = _batch((100, 0, False), (200, 50, False), (1, 99, True), (1, 199, True))
    t = model.timer
    floor = t.attention(AttentionShape(1, 0, 0, 0))
    expected = t.attention(AttentionShape(200, 50, 2, 150)) + t.attention(AttentionShape(100, 0, 0, 0)) - floor
    assert model.breakdown(batch)["attention"] == pytest.approx(model.shape.num_layers * expected, rel=1e-12)


# --- roofline ---------------------------------------------------------------------------------------------

def test_a_bigger_gpu_decodes_faster():
    batch = _batch(*[(1, 500, True)] * 32)
    h100, h200 = (RooflineCostModel.from_args(model="llama-3.1-8b", hardware=h) for h in ("h100", "h200"))
    assert h200.step_time(batch, 0).total < h100.step_time(batch, 0).total


def test_a_prefill_gemm_of_8192_tokens_is_compute_bound_at_mfu_eff():
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware="h100")
    hw, s = model.hardware, model.shape
    flops = 2.0 * 8192 * (2 * s.intermediate) * s.hidden
    nbytes = (2 * s.intermediate * s.hidden + 8192 * s.hidden + 8192 * 2 * s.intermediate) * s.dtype_bytes
    compute = flops / (hw.peak_flops * hw.mfu_eff)
    assert compute > nbytes / (hw.hbm_bandwidth * hw.bw_eff)
    assert model.timer.dense("gate_up_proj", 8192) == pytest.approx(compute + hw.kernel_floor, rel=1e-12)


TABLE_GPUS = ("h100", "h100-pcie", "h200", "b200", "a100", "a100-40gb", "l40s", "l4", "rtx-4090", "rtx-pro-6000")


@pytest.mark.parametrize("gpu", TABLE_GPUS)
def test_every_table_gpu_builds_a_roofline_with_a_positive_step_time(gpu):
    assert gpu in HARDWARE
    model = RooflineCostModel.from_args(model="llama-3.1-8b", hardware=gpu)
    assert isinstance(model, KernelSumCostModel) and model.hardware.name == gpu
    assert model.step_time(_batch(*MIXED), 0).total > 0
