"""NCCL collectives of a GPU as measured: AIConfigurator's `comm/nccl/<version>/nccl_perf` table (nccl-tests'
all_gather / reduce_scatter / all_reduce / alltoall, half precision, by GPU count and total message size),
where the `aic` extra is installed and has the GPU. A data-parallel MoE layer's dispatch (all-gather) and
combine (reduce-scatter) are priced from it; without it, from the hardware's link model."""
from __future__ import annotations

from functools import lru_cache

from sim.cost_models.aic_tables import AIC_SYSTEMS, mean_points, package_root, read_table, version_key
from sim.cost_models.log_curves import LogCurve

HALF_BYTES = 2


class MeasuredCollectives:
    """nccl-tests times by (op, GPUs), as curves over the whole buffer's bytes (nccl-tests' size: an
    all-gather's output, a reduce-scatter's input); `outside` counts lookups past the largest measured."""

    def __init__(self, system: str, version: str, curves: dict[tuple[str, int], LogCurve]) -> None:
        self.system, self.version, self.curves = system, version, curves
        self.source = f"AIConfigurator NCCL {version} tables of {system}"
        self.outside = 0

    def time(self, op: str, nbytes: float, gpus: int) -> float | None:
        """Seconds of `op` over `gpus` GPUs moving `nbytes` in all, or None where it was not measured."""
        curve = self.curves.get((op, gpus))
        if curve is None:
            return None
        self.outside += nbytes > curve.xs[-1]
        return curve(nbytes)


@lru_cache(maxsize=8)
def measured_collectives(hardware: str) -> MeasuredCollectives | None:
    """The GPU's measured NCCL collectives, or None (no aic extra, or no table for this GPU)."""
    system = AIC_SYSTEMS.get(hardware)
    if system is None:
        return None
    try:
        base = package_root() / "systems" / "data" / system / "comm" / "nccl"
    except ValueError:
        return None
    versions = sorted((d for d in base.glob("*") if (d / "nccl_perf.parquet").is_file()), key=lambda d: version_key(d.name))
    if not versions:
        return None
    df = read_table(str(versions[-1] / "nccl_perf.parquet"))
    df = df[(df["nccl_dtype"] == "half") & (df["latency"] > 0)]
    curves = {}
    for (op, gpus), g in df.groupby(["op_name", "num_gpus"]):
        xs, ts = mean_points(g.assign(nbytes=g["message_size"] * HALF_BYTES), "nbytes")
        curves[(str(op), int(gpus))] = LogCurve.of(xs, ts)
    return MeasuredCollectives(system, versions[-1].name, curves)

