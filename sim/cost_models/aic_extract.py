"""The extract of AIConfigurator's measured kernels and all-reduces kept in sim/cost_models/data/aic_extract
(with their roofline FLOPs and bytes), for the roofline's fit and the tests that need no package:
`python -c "from sim.cost_models.aic_extract import write_extract; print(write_extract())"` rewrites it."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sim.cost_models.batch import causal_pairs
from sim.cost_models.aic_tables import (AIC_SYSTEMS, TABLES, attention_lane, attention_rows, bf16_gemm, package_root,
                                        read_table, table_file, version_key)
from sim.cost_models.log_curves import bracket, nearest

EXTRACT_DIR = Path(__file__).with_name("data") / "aic_extract"
EXTRACT_FILE = EXTRACT_DIR / "kernels.csv"
EXTRACT_COLUMNS = ("gpu", "kernel", "op", "m", "n", "k", "batch", "kv", "heads", "kv_heads", "head_dim", "time_us",
                   "kind", "class", "queries", "flops", "bytes", "kernel_source", "table")
ALLREDUCE_FILE = EXTRACT_DIR / "allreduce.csv"
ALLREDUCE_COLUMNS = ("gpu", "vllm_version", "tp", "message_bytes", "time_us", "table")

# Shapes of the extract: the layer GEMMs of each model at each tensor-parallel degree.
_EXTRACT_MODELS = {"llama-3.1-8b": (4096, 32, 8, 128, 14336, (1,)), "qwen3-0.6b": (1024, 16, 8, 128, 3072, (1,)),
                   "qwen3-32b": (5120, 64, 8, 128, 25600, (1, 2))}
_EXTRACT_M = (1, 8, 32, 128, 512, 2048, 8192)
_EXTRACT_DECODE = ((1, 4, 16, 64, 128, 256), (128, 512, 1024, 2048, 4096, 8192))
_EXTRACT_CHUNKS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
EXTRACT_GPUS = ("h100", "h200", "b200", "a100", "l40s", "rtx-pro-6000")
# Message sizes (elements) of the all-reduce extract: 4096 and each fourfold size; the ones a table measured are kept.
_ALLREDUCE_SIZES = tuple(4096 * 4**i for i in range(16))
_ALLREDUCE_LANE = "vLLM_custom_graph"  # vLLM's custom all-reduce captured in a CUDA graph (backend vllm_graph)


def _table(root: Path, system: str, kind: str) -> tuple[str, Path]:
    found = table_file(root, system, kind)
    if found is None:
        raise ValueError(f"aiconfigurator {root}: no vLLM {kind} table for {system}")
    return found


def extract_rows(hardware: tuple[str, ...] = EXTRACT_GPUS) -> list[dict]:
    """Measured rows only: GEMMs at each layer shape's (n, k), or at the grid (n, k) around it when it is
    off the grid; decode attention at the grid contexts nearest each requested one; prefill at batch 1."""
    root = package_root()
    rows: list[dict] = []
    for hw in hardware:
        system = AIC_SYSTEMS[hw]
        version, path = _table(root, system, "gemm")
        gemm = bf16_gemm(str(path))
        ns, ks = sorted(set(gemm["n"])), sorted(set(gemm["k"]))
        for model, (h, heads, kvh, d, inter, tps) in _EXTRACT_MODELS.items():
            for tp in tps:
                q, kv, i = heads // tp * d, max(kvh // tp, 1) * d, inter // tp
                for op, (n, k) in {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "gate_up_proj": (2 * i, h),
                                   "down_proj": (h, i)}.items():
                    for cn, _ in bracket(ns, n)[0]:
                        for ck, _ in bracket(ks, k)[0]:
                            sel = gemm[(gemm["n"] == cn) & (gemm["k"] == ck) & gemm["m"].isin(_EXTRACT_M)]
                            label = f"{model}{f'-tp{tp}' if tp > 1 else ''}/{op}" + ("" if (cn, ck) == (n, k)
                                                                                      else f" (n={n} k={k})")
                            for r in sel.sort_values("m").itertuples():
                                rows.append({"gpu": hw, "kernel": "gemm", "op": label, "m": r.m, "n": cn, "k": ck,
                                             "time_us": round(r.latency * 1e3, 4), "kernel_source": r.kernel_source,
                                             "table": str(path.relative_to(root))})
        for kind, name in (("generation", "decode_attention"), ("context", "context_attention")):
            _, apath = _table(root, system, kind)
            df = attention_rows(str(apath))
            df = df[(df["num_heads"] == 32) & (df["num_key_value_heads"] == 8) & (df["head_dim"] == 128)]
            lane = attention_lane(df, 128)
            df = df[df["kernel_source"] == lane]
            if kind == "generation":
                steps = sorted(set(df["step"]))
                wanted = [(b, nearest(steps, kv)) for b in _EXTRACT_DECODE[0] for kv in _EXTRACT_DECODE[1]]
                picked = [df[(df["batch_size"] == b) & (df["step"] == s)] for b, s in wanted]
            else:
                picked = [df[(df["batch_size"] == 1) & (df["isl"] == c)] for c in _EXTRACT_CHUNKS]
            for sel in picked:
                for r in sel.itertuples():
                    shape = {"batch": r.batch_size, "kv": r.step} if kind == "generation" else {"batch": 1, "m": r.isl,
                                                                                                "kv": 0}
                    rows.append({"gpu": hw, "kernel": name, "op": "llama-3.1-8b/attention", **shape, "heads": 32,
                                 "kv_heads": 8,
                                 "head_dim": 128, "time_us": round(r.latency * 1e3, 4), "kernel_source": lane,
                                 "table": str(apath.relative_to(root))})
    return rows


def roofline_terms(row: dict) -> dict:
    """The row's work as the per-kernel roofline counts it (bf16): a GEMM's 2mnk FLOPs and its three
    matrices' bytes; attention's 4 FLOPs per head dimension per causal query-key pair and the K, V read
    plus q and the output. `queries`: the GEMM's rows, or the attention call's query tokens."""
    if row["kernel"] == "gemm":
        m, n, k = row["m"], row["n"], row["k"]
        return {"kind": "gemm", "class": "gemm", "queries": m, "flops": 2 * m * n * k, "bytes": 2 * (n * k + m * k + m * n)}
    q_size, kv_size = row["heads"] * row["head_dim"], row["kv_heads"] * row["head_dim"]
    if row["kernel"] == "decode_attention":
        queries, pairs, kv_tokens = row["batch"], row["batch"] * row["kv"], row["batch"] * row["kv"]
    else:
        queries, pairs, kv_tokens = row["m"], int(causal_pairs(row["m"], 0)), row["m"]
    return {"kind": row["kernel"], "class": "attention", "queries": queries, "flops": 4 * q_size * pairs,
            "bytes": 2 * (2 * kv_tokens * kv_size + 2 * queries * q_size)}


def allreduce_rows(hardware: tuple[str, ...] = EXTRACT_GPUS) -> list[dict]:
    """vLLM's custom all-reduce in a CUDA graph, bf16, from every vLLM version directory of each GPU's comm
    tables: each measured GPU count, message sizes of _ALLREDUCE_SIZES the table measured."""
    root = package_root()
    rows: list[dict] = []
    for hw in hardware:
        base = root / "systems" / "data" / AIC_SYSTEMS[hw] / "comm" / "vllm"
        versions = sorted((p.name for p in base.iterdir() if p.is_dir()), key=version_key) if base.is_dir() else []
        for version in versions:
            path = base / version / (TABLES["all_reduce"][1] + ".parquet")
            if not path.is_file():
                continue
            df = read_table(str(path))
            df = df[(df["kernel_source"] == _ALLREDUCE_LANE) & (df["allreduce_dtype"] == "bfloat16")
                    & (df["latency"] > 0) & df["message_size"].isin(_ALLREDUCE_SIZES)]
            mean = df.groupby(["num_gpus", "message_size"])["latency"].mean()
            for (tp, elements), ms in mean.items():
                rows.append({"gpu": hw, "vllm_version": version, "tp": int(tp), "message_bytes": int(elements) * 2,
                             "time_us": round(float(ms) * 1e3, 4), "table": str(path.relative_to(root))})
    return rows


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> int:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return len(rows)


def write_extract(path: Path = EXTRACT_FILE, allreduce_path: Path = ALLREDUCE_FILE) -> dict[str, int]:
    """Writes `extract_rows()` (with their roofline terms) and `allreduce_rows()` as CSV; returns each
    file's row count by file name."""
    kernels = [{**r, **roofline_terms(r)} for r in extract_rows()]
    return {path.name: _write_csv(path, EXTRACT_COLUMNS, kernels),
            allreduce_path.name: _write_csv(allreduce_path, ALLREDUCE_COLUMNS, allreduce_rows())}


def load_extract(path: Path = EXTRACT_FILE) -> list[dict[str, Any]]:
    """The extract's rows (`kernels.csv`, or `ALLREDUCE_FILE`), numbers as int or float and empty cells as
    None; needs no aiconfigurator."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rec: dict[str, Any] = {}
            for key, text in row.items():
                if key in ("gpu", "kernel", "op", "kind", "class", "kernel_source", "table", "vllm_version"):
                    rec[key] = text
                elif text == "":
                    rec[key] = None
                else:
                    rec[key] = float(text) if key == "time_us" else int(text)
            out.append(rec)
    return out
