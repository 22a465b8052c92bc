"""The per-kernel roofline held to measured kernels: the extract of NVIDIA AIConfigurator's vLLM
databases shipped in sim/cost_models/data/aic_extract (Apache-2.0, LICENSE beside it), for every GPU it
covers, priced through the cost model's own kernel code at each row's shape."""
import csv
import statistics

import pytest

from sim.cost_models.aic_extract import EXTRACT_FILE
from sim.cost_models.hardware import get_hardware
from sim.cost_models.kernels import AttentionShape
from sim.cost_models.model_shape import model_shape
from sim.cost_models.roofline import RooflineKernels

PRESETS = ("llama-3.1-8b", "qwen3-0.6b")


def _rows() -> list[dict]:
    with EXTRACT_FILE.open() as f:
        return [r for r in csv.DictReader(f) if r["op"].split("/")[0] in PRESETS]


def _ratio(row: dict) -> float:
    """Roofline time over measured time for one extract row."""
    model, op = row["op"].split("/")
    op = op.split(" ")[0]  # "down_proj (n=4096 k=14336)": the layer's own GEMM
    timer = RooflineKernels(model_shape(model), get_hardware(row["gpu"]))
    if op == "lm_head":
        t = timer.per_sequence(op, int(row["m"]))
    elif row["kernel"] == "gemm":
        t = timer.dense(op, int(row["m"]))
    elif row["kernel"] == "decode_attention":
        t = timer.attention(AttentionShape(0, 0, int(row["batch"]), int(row["kv"]) + 1))
    else:
        t = timer.attention(AttentionShape(int(row["m"]), 0, 0, 0))
    return t / (float(row["time_us"]) * 1e-6)


GPUS = sorted({r["gpu"] for r in _rows()})


def test_the_extract_covers_each_gpu_family_the_table_fits_from_it():
    assert {get_hardware(g).family for g in GPUS} >= {"hopper", "ampere", "ada", "blackwell", "blackwell-rtx"}


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("kernel", ["gemm", "decode_attention", "context_attention"])
def test_the_roofline_lands_on_the_measured_kernels_at_the_median(gpu, kernel):
    ratios = [_ratio(r) for r in _rows() if r["gpu"] == gpu and r["kernel"] == kernel]
    assert ratios, (gpu, kernel)
    assert 0.75 <= statistics.median(ratios) <= 1.33, (gpu, kernel, statistics.median(ratios))


@pytest.mark.parametrize("gpu", GPUS)
def test_nine_in_ten_measured_kernels_are_within_a_factor_of_two(gpu):
    ratios = [_ratio(r) for r in _rows() if r["gpu"] == gpu]
    inside = sum(0.5 <= x <= 2.0 for x in ratios)
    assert inside >= 0.9 * len(ratios), (gpu, inside, len(ratios))
