"""Where AIConfigurator's measured vLLM tables lie in the installed `aiconfigurator-core` package, and how
each is read and narrowed to what vLLM runs by default (bf16 GEMMs, bf16 attention with a bf16 KV cache,
vLLM's default attention kernel). Found without importing the package: its Rust extension loads on
import, and only its data files are read."""
from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

MISSING_EXTRA = "--cost-model aiconfigurator: needs the aic extra (pip install 'stepscope[aic]')"
PACKAGE = "aiconfigurator-core"
# stepscope hardware name -> AIConfigurator system (its systems/<name>.yaml and systems/data/<name>/).
AIC_SYSTEMS = {"a100": "a100_sxm", "b200": "b200_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "l40s": "l40s",
               "rtx-pro-6000": "rtx_pro_6000_server"}
TABLES = {"gemm": ("gemm", "gemm_perf"), "context": ("attention", "context_attention_perf"),
          "generation": ("attention", "generation_attention_perf"), "all_reduce": ("comm", "custom_allreduce_perf"),
          "moe": ("moe", "moe_perf")}
# vLLM's default attention kernel first (FA3 on Hopper, FlashInfer's TRT-LLM kernels on B200, FA2 on
# Ada and consumer Blackwell, the single FA lane of older tables); the rest only if none of these is there.
ATTENTION_LANES = ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill", "vllm_flashinfer_trtllmdecode",
                   "vllm_flash_attn_fa2", "vllm_flash_attn", "vllm_flashinfer_fiprefill", "vllm_flashinfer_fidecode",
                   "vllm_flashinfer", "vllm_flash_attn_fa4", "vllm_triton_attn")
MS = 1e-3  # every table's latency column is in milliseconds (CUDA event time)
# The MoE table's shape columns: AIConfigurator passes the model's whole expert width as inter_size and the
# split as moe_tp_size (sdk/models/blocks/moe.py builds ops.MoE(hidden, moe_inter_size, topk, num_experts,
# moe_tp_size, moe_ep_size, ...)).
MOE_SHAPE = ("hidden_size", "inter_size", "topk", "num_experts")


def package_root() -> Path:
    """The installed aiconfigurator_core directory, found without importing it (its Rust extension loads
    on import, and only the data files are read here)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(MISSING_EXTRA)
    return Path(next(iter(spec.submodule_search_locations)))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.\-+]", version))


def table_file(root: Path, system: str, kind: str, prefer: str | None = None) -> tuple[str, Path] | None:
    """(vLLM version, file) of the version directory `prefer` names if it holds a table of this kind, else
    of the newest one that does, or None."""
    family, stem = TABLES[kind]
    base = root / "systems" / "data" / system / family / "vllm"
    if not base.is_dir():
        return None
    versions = sorted((p.name for p in base.iterdir() if p.is_dir()), key=version_key, reverse=True)
    for version in ([prefer] if prefer in versions else []) + versions:
        for ext in (".parquet", ".csv", ".txt"):
            path = base / version / (stem + ext)
            if path.is_file():
                return version, path
    return None


def available_hardware(root: Path | None = None) -> list[str]:
    """The stepscope hardware names whose system has vLLM GEMM and attention tables in the installed package."""
    root = root or package_root()
    return sorted(name for name, system in AIC_SYSTEMS.items()
                  if all(table_file(root, system, kind) for kind in ("gemm", "context", "generation")))


@lru_cache(maxsize=32)
def read_table(path: str) -> pd.DataFrame:
    """One table, parsed once per process (sweeps build many cost models over the same files)."""
    import pandas as pd

    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path, skipinitialspace=True)


GEMM_DTYPES = {"bf16": ("bfloat16", "float16"), "fp8": ("fp8",)}  # fp8: per-tensor scaled, vLLM's --quantization fp8


def bf16_gemm(path: str, dtype: str = "bf16") -> pd.DataFrame:
    """The table's GEMMs of one dtype (`bf16`, or `fp8` where it measured them: empty otherwise)."""
    df = read_table(path)
    df = df[df["latency"] > 0]
    if "gemm_dtype" in df:
        df = df[df["gemm_dtype"].isin(GEMM_DTYPES[dtype])]
    elif dtype != "bf16":
        return df.iloc[:0]
    if "kernel_source" in df and df["kernel_source"].nunique() > 1:  # one kernel per shape: the best-covered
        df = df[df["kernel_source"] == df["kernel_source"].value_counts().idxmax()]
    return df


@lru_cache(maxsize=16)
def gemm_grid(path: str, dtype: str = "bf16") -> tuple[dict[tuple[int, int], tuple[list[float], list[float]]],
                                                        list[int], list[int]]:
    """{(n, k): (m, seconds)} of the GEMMs of `dtype`, with the sorted n and k grids (empty: none measured)."""
    mean = bf16_gemm(path, dtype).groupby(["n", "k", "m"])["latency"].mean()  # sorted by n, k, then m
    n, k, m = (mean.index.get_level_values(i).to_numpy() for i in range(3))
    t = mean.to_numpy() * MS
    starts = [0, *(i for i in range(1, len(n)) if n[i] != n[i - 1] or k[i] != k[i - 1]), len(n)]
    table = {(int(n[a]), int(k[a])): (m[a:b].tolist(), t[a:b].tolist()) for a, b in zip(starts, starts[1:])}
    return table, sorted({n for n, _ in table}), sorted({k for _, k in table})


def attention_rows(path: str) -> pd.DataFrame:
    """bf16 attention with a bf16 KV cache, no sliding window, no beam search."""
    df = read_table(path)
    df = df[df["latency"] > 0]
    keep = df["kv_cache_dtype"].isin(("bfloat16", "float16")) if "kv_cache_dtype" in df else True
    if "window_size" in df:
        keep = keep & (df["window_size"] == 0)
    if "beam_width" in df:
        keep = keep & (df["beam_width"] == 1)
    return df[keep] if keep is not True else df


def attention_lane(df: pd.DataFrame, head_dim: int) -> str:
    """vLLM's default kernel among the table's lanes: the first of ATTENTION_LANES that measured this
    head_dim, else the first present, else the lane with the most rows."""
    present = set(df["kernel_source"])
    known = [lane for lane in ATTENTION_LANES if lane in present]
    dims = df.groupby("kernel_source")["head_dim"].agg(set)
    return next((lane for lane in known if head_dim in dims[lane]),
                known[0] if known else str(df["kernel_source"].value_counts().idxmax()))


def moe_systems(root: Path | None = None) -> list[str]:
    """The stepscope hardware names whose system has a vLLM MoE table in the installed package."""
    root = root or package_root()
    return sorted(name for name, system in AIC_SYSTEMS.items() if table_file(root, system, "moe"))


@lru_cache(maxsize=16)
def moe_shapes(path: str, dtype: str) -> list[tuple[int, int, int, int]]:
    """The (hidden, expert width, top-k, experts) the MoE table measured at `dtype`."""
    df = read_table(path)
    df = df[df["moe_dtype"] == dtype]
    return sorted({(int(h), int(w), int(k), int(e)) for h, w, k, e in df[list(MOE_SHAPE)].itertuples(index=False)})


@lru_cache(maxsize=32)
def moe_grid(path: str, dtype: str, shape: tuple[int, int, int, int]) -> tuple[str, dict[tuple[int, int, str], tuple[
        list[float], list[float]]]]:
    """(kernel, {(moe_tp, moe_ep, distribution): (tokens, seconds)}) of one expert shape at `dtype`, from
    the kernel that measured most of it where several did."""
    df = read_table(path)
    df = df[(df["moe_dtype"] == dtype) & (df["latency"] > 0)]
    for column, value in zip(MOE_SHAPE, shape):
        df = df[df[column] == value]
    if df.empty:
        return "", {}
    kernel = str(df["kernel_source"].value_counts().idxmax())
    df = df[df["kernel_source"] == kernel]
    mean = df.groupby(["moe_tp_size", "moe_ep_size", "distribution", "num_tokens"])["latency"].mean()
    grid: dict[tuple[int, int, str], tuple[list[float], list[float]]] = {}
    for (tp, ep, dist, tokens), ms in mean.items():
        xs, ts = grid.setdefault((int(tp), int(ep), str(dist)), ([], []))
        xs.append(float(tokens))
        ts.append(float(ms) * MS)
    return kernel, grid


def mean_points(g: pd.DataFrame, x: str) -> tuple[list[float], list[float]]:
    """(x, seconds) sorted by x, repeated measurements of one x averaged."""
    m = g.groupby(x)["latency"].mean().sort_index()
    return m.index.tolist(), [t * MS for t in m.tolist()]
