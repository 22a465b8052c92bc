"""Kernel times from NVIDIA AIConfigurator's measured databases (the `aic` extra: `aiconfigurator-core`),
for the vLLM backend: the bf16 GEMM table prices the projections and the LM head, the context and
generation attention tables price attention, vLLM's custom all-reduce table prices the all-reduces, and
the MoE table prices a sparse layer's fused experts (`AIConfiguratorKernels.moe`). The data-parallel
all-gather and reduce-scatter around the experts stay with the hardware's link model: the kernel sum asks
its timer for no collective but the all-reduce.

The package measures no norm, rotary, activation, embedding or sampler kernels, so those are a bandwidth
formula here with both constants from the GPU's own GEMM table: the floor is the median time of the
smallest batch-1 GEMMs (n and k up to FLOOR_MAX_NK), the bandwidth the median a batch-1 GEMM reaches
streaming at least STREAM_MIN_BYTES of weights (too many to stay in L2).

Times are interpolated linearly in log-log space between measured points. Below a table's grid a kernel
costs the smallest measured one (no problem is faster than the launch floor); above it, time grows in
proportion to the axis (GEMM m, n, k; decode batch and context) or to its square (prefill chunk, causal
attention). Lookups past the top count in `outside`; shapes off the n/k or head grids, fixed for a
model, are listed by `describe()` instead. A MoE curve is first made non-decreasing in tokens (many of
the tables' curves have a point well above a later one), and its shape must be measured: an expert shape
or split the table lacks is refused rather than guessed.
"""
from __future__ import annotations

import importlib.metadata
import math
from typing import TYPE_CHECKING, Any

from sim.cost_models.aic_tables import (AIC_SYSTEMS, MS, PACKAGE, TABLES, attention_lane, attention_rows,
                                        available_hardware, bf16_gemm, gemm_grid, mean_points, moe_grid, moe_shapes,
                                        moe_systems, package_root, read_table, table_file)
from sim.cost_models.hardware import get_hardware
from sim.cost_models.kernels import AttentionShape, MoeCall
from sim.cost_models.log_curves import BatchGrid, LogCurve, Streaming, blend, bracket, nearest, non_decreasing
from sim.cost_models.routing import RoutingModel, Zipf

if TYPE_CHECKING:
    import pandas as pd

    from sim.cost_models.model_shape import ModelShape

FLOOR_MAX_NK = 128  # the GEMMs whose time is all launch and tail
STREAM_MIN_BYTES = 256 << 20  # weights too large to stay in L2: the GEMM streams them from memory
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4}


class AIConfiguratorKernels:
    """`KernelTimes` of one tensor-parallel rank from AIConfigurator's measured vLLM tables.

    `shape` is already the rank's shard (heads, KV heads, intermediate and vocab divided by `tp`; experts
    or their width divided among the MoE ranks); `tp` is only used to give the sampler the whole vocabulary
    (vLLM gathers the logits before sampling); `vllm_version` picks that version's measured all-reduces
    where the database has them; `routing` (default balanced) picks the MoE table's routing distribution
    (a Zipf law: the nearest measured power law). Tables are parsed once per process and each op's curve
    built on first use, so a lookup is a bisect and a power: a simulation prices millions of steps.
    """

    def __init__(self, shape: ModelShape, hardware: str, tp: int = 1, vllm_version: str | None = None,
                 routing: RoutingModel | None = None) -> None:
        root = package_root()
        key = str(hardware).lower()
        available = available_hardware(root)
        if key not in available:
            raise ValueError(f"--hardware {hardware}: AIConfigurator has no vLLM kernel tables for it; available: "
                             f"{', '.join(available)}")
        if shape.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"--cost-model aiconfigurator: prices 16-bit models from the bf16 tables, "
                             f"not {shape.dtype}")
        self.shape = shape
        self.hardware = key
        self.system = AIC_SYSTEMS[key]
        self.tp = tp
        self.root = root
        self.version = importlib.metadata.version(PACKAGE)
        # Kernels from the newest tables; all-reduces from the run's own vLLM version where it was measured
        # (vLLM's custom all-reduce changed more between versions than its kernels did).
        self.files = {kind: found for kind in TABLES
                      if (found := table_file(root, self.system, kind, vllm_version if kind == "all_reduce" else None))}
        self.source = f"AIConfigurator {self.version} {self.system} (vLLM {self.files['gemm'][0]} kernel tables)"
        self.outside = 0
        self._dense: dict[str, Any] = {}
        self._sequence: dict[str, Any] = {}
        self._gemms: dict[tuple[int, int, str], LogCurve] = {}
        self._context: LogCurve | None = None
        self._decode: BatchGrid | None = None
        self._all_reduce: dict[tuple[int, bool], LogCurve | None] = {}
        self._streaming: tuple[float, float] | None = None
        self.notes: dict[str, str] = {}
        self.mixed_attn_eff = get_hardware(key).mixed_attn_eff
        self.routing = routing
        self._moe: dict[tuple[int, int], tuple[LogCurve, bool]] = {}
        self._moe_tables: dict[str, dict[str, Any]] = {}

    # --- the KernelTimes seam -------------------------------------------------------------------------

    def dense(self, op: str, tokens: int) -> float:
        return self._time(self._dense, self._build_dense, op, tokens)

    def per_sequence(self, op: str, sequences: int) -> float:
        return self._time(self._sequence, self._build_sequence, op, sequences)

    def _time(self, built: dict[str, Any], build: Any, op: str, x: int) -> float:
        """The op's time at x, its curve built on first use; a measured curve's lookups past it are counted."""
        if x <= 0:
            return 0.0
        f = built.get(op)
        if f is None:
            f = built[op] = build(op)
        if f.__class__ is LogCurve and x > f.xs[-1]:
            self.outside += 1
        return f(x)

    def attention(self, shape: AttentionShape) -> float:
        """The prefill chunk's context attention plus the decodes' generation attention, each measured
        alone. vLLM runs them as one varlen call, in which decodes may lose their split-KV kernel: the
        databases measure no such call, so the decodes' share is divided by the GPU family's
        `mixed_attn_eff`, fitted where mixed calls were measured (1 where they were not)."""
        t = 0.0
        if shape.prefill_chunk > 0:
            t += self._prefill(shape.prefill_chunk, shape.kv_prefill)
        if shape.n_decode > 0:
            grid = self._decode
            if grid is None:
                grid = self._build_decode()
            kv = shape.kv_decode
            decode, outside = grid.at(shape.n_decode, kv if kv > 1 else 1)
            if outside:
                self.outside += 1
            t += decode / self.mixed_attn_eff if shape.prefill_chunk > 0 else decode
        return t

    def caveats(self) -> list[str]:
        """The fp8 fallback only: its other notes (interpolated shapes) are in describe()."""
        return [f"aiconfigurator: {self.notes['gemm fp8']}"] if "gemm fp8" in self.notes else []

    def skew_alpha(self, shape: AttentionShape, kv_min: int, kv_max: int) -> float:
        """0: the tables measure batches of equal contexts only, so attention is priced at the mean."""
        return 0.0

    def all_reduce_time(self, nbytes: float, tp: int, eager: bool = False) -> float | None:
        """vLLM's all-reduce of `nbytes` over `tp` GPUs as measured (custom all-reduce inside a CUDA graph,
        or eager), or None where the database has no measurement for this GPU and degree."""
        if tp <= 1 or nbytes <= 0:
            return 0.0
        key = (tp, eager)
        if key not in self._all_reduce:
            self._all_reduce[key] = self._build_all_reduce(tp, eager)
        curve = self._all_reduce[key]
        if curve is None:
            return None
        if nbytes > curve.xs[-1]:
            self.outside += 1
        return curve(nbytes)

    def describe(self) -> dict[str, Any]:
        floor, bandwidth = self._streaming_constants()
        self._context or self._build_context()
        self._decode or self._build_decode()
        files = {kind: {"vllm_version": v, "path": str(p.relative_to(self.root))} for kind, (v, p) in self.files.items()}
        return {"source": self.source, "package": PACKAGE, "version": self.version, "system": self.system,
                "hardware": self.hardware, "device": str(read_table(str(self.files["gemm"][1]))["device"].iloc[0]),
                "backend": "vllm", "tables": files, "kernel_floor_s": floor, "stream_bandwidth_Bps": bandwidth,
                "unmeasured": "layernorm, qk_norm, rotary_emb, act_fn, embedding, final_layernorm, sampler, "
                              "MoE top-k: floor + bytes / stream bandwidth", "moe": dict(self._moe_tables),
                "notes": dict(self.notes)}

    # --- GEMMs ----------------------------------------------------------------------------------------

    def gemm(self, n: int, k: int, dtype: str = "bf16") -> LogCurve:
        """The GEMM (m x k) @ (k x n) over m of `dtype` (bf16, or fp8 where measured): the measured curve at
        a grid (n, k), log-log between the grid's n and k neighbours, in proportion to n and k past the
        largest measured."""
        curve = self._gemms.get((n, k, dtype))
        if curve is not None:
            return curve
        table, ns, ks = gemm_grid(str(self.files["gemm"][1]), dtype)
        if not table:
            self.notes["gemm fp8"] = "the tables measured no fp8 GEMM on this GPU: bf16's times"
            return self.gemm(n, k)
        n_pts, n_scale = bracket(ns, n)
        k_pts, k_scale = bracket(ks, k)
        corners = []
        for cn, wn in n_pts:
            for ck, wk in k_pts:
                if (cn, ck) in table:
                    corners.append((LogCurve.of(*table[(cn, ck)]), wn * wk, 1.0))
                else:  # a hole in the grid: the nearest measured shape, scaled by the work
                    near = min(table, key=lambda nk: abs(math.log(nk[0] * nk[1] / (cn * ck))))
                    ms, ts = table[near]
                    scale = cn * ck / (near[0] * near[1])
                    corners.append((LogCurve.of(ms, [t * scale for t in ts]), wn * wk, scale))
        if n_scale != 1.0 or k_scale != 1.0 or len(corners) > 1 or corners[0][2] != 1.0:
            self.notes[f"gemm n={n} k={k}"] = ("interpolated between measured n, k" if n_scale == k_scale == 1.0
                                               else "past the largest measured n or k: scaled in proportion")
        if len(corners) == 1 and n_scale == k_scale == 1.0:
            curve = corners[0][0]
        else:
            points = sorted(set().union(*(c.xs for c, _, _ in corners)))
            curve = LogCurve.of(points, blend([(c, w) for c, w, _ in corners], points, n_scale * k_scale))
        self._gemms[(n, k, dtype)] = curve
        return curve

    def _build_dense(self, op: str) -> Any:
        s = self.shape
        gemms = {"qkv_proj": ((s.num_heads + 2 * s.num_kv_heads) * s.head_dim, s.hidden),
                 "o_proj": (s.hidden, s.num_heads * s.head_dim), "gate_up_proj": (2 * s.intermediate, s.hidden),
                 "down_proj": (s.hidden, s.intermediate)}
        if op in gemms:  # fp8 quantization stores these weights at one byte (the LM head stays 16-bit)
            return self.gemm(*gemms[op], "fp8" if s.quantization == "fp8" else "bf16")
        b = s.dtype_bytes
        qk = (s.num_heads + s.num_kv_heads) * s.head_dim
        # Bytes per token: the fused residual add + RMS norm reads and writes the hidden state and the
        # residual; q/k norm and rotary read and write q and k; SiLU-and-mul reads gate and up and writes
        # one; the embedding gathers one row and writes it.
        per_token = {"layernorm": 4 * s.hidden * b, "final_layernorm": 4 * s.hidden * b,
                     "qk_norm": 2 * qk * b if s.qk_norm else 0, "rotary_emb": 2 * qk * b,
                     "act_fn": 3 * s.intermediate * b, "embedding": 2 * s.hidden * b}
        if op not in per_token:
            raise ValueError(f"unknown dense op {op!r}; known: {', '.join([*gemms, *per_token])}")
        if not per_token[op]:
            return Streaming(0.0, 0.0)
        floor, bandwidth = self._streaming_constants()
        return Streaming(floor, per_token[op] / bandwidth)

    def _build_sequence(self, op: str) -> Any:
        s = self.shape
        if op == "lm_head":
            return self.gemm(s.vocab, s.hidden)
        if op == "sampler":
            # Three passes over the gathered float32 logits (cast from bf16, probabilities, the pick):
            # (2 + 4) + (4 + 4) + 4 bytes per vocabulary entry, three kernel floors.
            floor, bandwidth = self._streaming_constants()
            return Streaming(3 * floor, 18 * s.vocab * self.tp / bandwidth)
        raise ValueError(f"unknown per-sequence op {op!r}; known: lm_head, sampler")

    def _streaming_constants(self) -> tuple[float, float]:
        """(floor seconds, bytes/s) from the GEMM table: the median of the smallest batch-1 GEMMs, and the
        median weight-streaming rate of batch-1 GEMMs with at least STREAM_MIN_BYTES of weights."""
        if self._streaming is None:
            df = bf16_gemm(str(self.files["gemm"][1]))
            one = df[df["m"] == 1]
            small = one[(one["n"] <= FLOOR_MAX_NK) & (one["k"] <= FLOOR_MAX_NK)]["latency"]
            big = one[2 * one["n"] * one["k"] >= STREAM_MIN_BYTES]
            if small.empty or big.empty:
                raise ValueError(f"{self.files['gemm'][1]}: no batch-1 GEMMs to take a kernel floor and bandwidth from")
            rate = (2 * big["n"] * big["k"]) / (big["latency"] * MS)
            self._streaming = (float(small.median()) * MS, float(rate.median()))
        return self._streaming

    # --- attention ------------------------------------------------------------------------------------

    def _slice(self, kind: str) -> tuple[pd.DataFrame, float, str]:
        """The measured rows for this model's heads: (rows, scale, label). Off the head grid: log-log
        between the two measured query-head counts around it (label says so and the caller blends), a
        nearest head_dim / KV-head count scaled up in proportion when the model's is larger."""
        s = self.shape
        df = attention_rows(str(self.files[kind][1]))
        lane = attention_lane(df, s.head_dim)
        df = df[df["kernel_source"] == lane]
        dims = sorted(set(df["head_dim"]))
        d = s.head_dim if s.head_dim in dims else nearest(dims, s.head_dim)
        df = df[df["head_dim"] == d]
        kvs = sorted(set(df["num_key_value_heads"]))
        kv = s.num_kv_heads if s.num_kv_heads in kvs else nearest(kvs, s.num_kv_heads)
        df = df[df["num_key_value_heads"] == kv]
        # Decode streams the KV cache (KV heads x head_dim), prefill computes per query head x head_dim.
        grow = (s.num_kv_heads / kv if kind == "generation" else 1.0) * s.head_dim / d
        scale = max(grow, 1.0)
        if (d, kv) != (s.head_dim, s.num_kv_heads):
            self.notes[f"{kind} attention"] = (f"{s.num_heads}/{s.num_kv_heads} heads of {s.head_dim} not measured: "
                                               f"KV heads {kv}, head_dim {d}, scaled by {scale:g}")
        return df, scale, str(lane)

    def _by_heads(self, df: pd.DataFrame, build: Any) -> list[tuple[Any, float]]:
        """The per-query-head-count tables around the model's, with log-space weights."""
        heads = sorted(set(df["num_heads"]))
        pts, over = bracket(heads, self.shape.num_heads)
        if len(pts) > 1 or over != 1.0 or pts[0][0] != self.shape.num_heads:
            self.notes["query heads"] = (f"{self.shape.num_heads} not measured: from {[h for h, _ in pts]}"
                                         + (f", scaled by {over:g}" if over != 1.0 else ""))
        return [(build(df[df["num_heads"] == h], over), w) for h, w in pts]

    def _build_context(self) -> LogCurve:
        rows, scale, lane = self._slice("context")
        rows = rows[rows["batch_size"] == 1]

        def curve(g: pd.DataFrame, over: float) -> LogCurve:
            xs, ts = mean_points(g, "isl")
            return LogCurve.of(xs, [t * scale * over for t in ts], power=2.0)

        parts = self._by_heads(rows, curve)
        if len(parts) == 1:
            self._context = parts[0][0]
        else:
            points = sorted(set().union(*(c.xs for c, _ in parts)))
            self._context = LogCurve.of(points, blend(parts, points), power=2.0)
        self.notes["context lane"] = lane
        return self._context

    def _prefill(self, chunk: int, cached: int) -> float:
        """A chunk of `chunk` tokens after `cached` ones. The table measures prefills without a cache, so
        this is the whole prefill of chunk + cached tokens times the share of its query-key pairs the
        chunk computes, but never less than the chunk alone without a cache."""
        curve = self._context
        if curve is None:
            curve = self._build_context()
        total = chunk + cached
        if total > curve.xs[-1]:
            self.outside += 1
        alone = curve(chunk)
        if cached <= 0:
            return alone
        share = chunk * (chunk + 2 * cached) / (total * total)
        with_cache = curve(total) * share
        return with_cache if with_cache > alone else alone

    def _build_decode(self) -> BatchGrid:
        rows, scale, lane = self._slice("generation")

        def grid(g: pd.DataFrame, over: float) -> BatchGrid:
            batches, curves = [], []
            for b, gb in g.groupby("batch_size"):
                # The table's step is the context each decode attends to (cached tokens plus its own).
                xs, ts = mean_points(gb, "step")
                curves.append(LogCurve.of(xs, [t * scale * over for t in ts]))
                batches.append(float(b))
            return BatchGrid(tuple(batches), tuple(curves))

        parts = self._by_heads(rows, grid)
        if len(parts) == 1:
            self._decode = parts[0][0]
        else:  # blend the head counts at the union of each batch row's measured contexts
            (g0, w0), (g1, w1) = parts
            batches = sorted(set(g0.batches) & set(g1.batches))
            curves = []
            for b in batches:
                pts = sorted(set(g0.curves[g0.batches.index(b)].xs) | set(g1.curves[g1.batches.index(b)].xs))
                ts = [math.exp(w0 * math.log(g0(b, x)) + w1 * math.log(g1(b, x))) for x in pts]
                curves.append(LogCurve.of(pts, ts))
            self._decode = BatchGrid(tuple(batches), tuple(curves))
        self.notes["generation lane"] = lane
        return self._decode

    # --- mixture of experts ---------------------------------------------------------------------------

    def moe(self, call: MoeCall) -> float:
        """The router GEMM and its top-k kernel, the fused experts from the MoE table, shared experts as a
        gated MLP. The table is read as AIConfigurator queries it for vLLM: its num_tokens are all the tokens
        entering one rank's block (every data-parallel rank's, gathered), its inter_size the whole expert
        width split `moe_tp_size` (= `width_split`) ways, `moe_ep_size` the experts over those held here. Its
        balanced rows route deterministically, min(tokens x top_k, experts) distinct experts in all, so they
        are scaled by the call's distinct experts over theirs: while few tokens share an expert, the block
        reads each activated expert's weights once and its time follows their count."""
        if call.tokens <= 0:
            return 0.0
        s = self.shape
        ep = s.router_experts // s.num_experts
        key = (call.width_split, ep)
        built = self._moe.get(key)
        if built is None:
            built = self._moe[key] = self._build_moe(*key)
        curve, balanced = built
        if call.tokens > curve.xs[-1]:
            self.outside += 1
        t = curve(call.tokens)
        if balanced:
            t *= call.activated * ep / min(call.tokens * s.top_k, s.router_experts)
        floor, bandwidth = self._streaming_constants()
        t += self.gemm(s.router_experts, s.hidden)(call.tokens) + floor
        if s.shared_intermediate:
            width = s.shared_intermediate
            t += self.gemm(2 * width, s.hidden)(call.tokens) + self.gemm(s.hidden, width)(call.tokens)
            t += floor + call.tokens * 3 * width * s.dtype_bytes / bandwidth
        return t

    def _build_moe(self, tp: int, ep: int) -> tuple[LogCurve, bool]:
        """The fused experts' curve over tokens at this split, and whether it is the balanced rows; raises
        ValueError naming what the table lacks and what it has."""
        s = self.shape
        found = self.files.get("moe")
        if found is None:
            raise ValueError(f"--hardware {self.hardware}: AIConfigurator {self.version} has no vLLM MoE table for "
                             f"{self.system}; GPUs with one: {', '.join(moe_systems(self.root))}")
        version, path = found
        want = (s.hidden, s.moe_intermediate * tp, s.top_k, s.router_experts)
        label = f"hidden {want[0]}, expert width {want[1]}, top-{want[2]} of {want[3]} experts"
        dtype = "bfloat16"
        if s.quantization == "fp8":
            if moe_grid(str(path), "fp8", want)[1]:
                dtype = "fp8"
            else:
                self.notes["moe fp8"] = f"no fp8 rows for {label}: priced from the bf16 ones"
        kernel, grid = moe_grid(str(path), dtype, want)
        where = f"AIConfigurator's vLLM {version} MoE table for {self.system}"
        if not grid:
            measured = ", ".join("/".join(map(str, shape)) for shape in moe_shapes(str(path), dtype))
            raise ValueError(f"--hardware {self.hardware}: {where} has no {dtype} rows for {label}; measured "
                             f"(hidden/width/top-k/experts): {measured}")
        dists = {d: exponent for (t, e, d) in grid if (t, e) == (tp, ep) and (exponent := _exponent(d)) is not None}
        if not dists:
            splits = ", ".join(f"{t}x{e}" for t, e in sorted({(t, e) for t, e, _ in grid}))
            raise ValueError(f"--hardware {self.hardware}: {where} has no moe_tp {tp} x moe_ep {ep} rows for {label}; "
                             f"measured (moe_tp x moe_ep): {splits}")
        routing = self.routing
        want_exponent = routing.exponent if isinstance(routing, Zipf) else 0.0
        dist = min(dists, key=lambda d: (abs(dists[d] - want_exponent), dists[d]))
        name = routing.name if routing is not None else "balanced"
        if dists[dist] != want_exponent:
            self.notes[f"moe routing {name}"] = (
                f"priced from the {dist} rows, the nearest measured (balanced counts as exponent 0); AIConfigurator's "
                "power-law alpha is the exponent of its sampled per-expert load density, not a Zipf rank law, so "
                "the match is nominal")
        xs, measured_ts = grid[(tp, ep, dist)]
        ts = non_decreasing(measured_ts)
        lowered = sum(a != b for a, b in zip(ts, measured_ts))
        if lowered:
            self.notes[f"moe moe_tp {tp} x moe_ep {ep}"] = (f"{lowered} measured times above a later one lowered "
                                                           "to it (a step never gets cheaper with more tokens)")
        self._moe_tables[f"moe_tp {tp} x moe_ep {ep}"] = {
            "vllm_version": version, "kernel": kernel, "dtype": dtype, "distribution": dist, "shape": label,
            "scaled_by_activated": dist == "balanced"}
        return LogCurve.of(xs, ts), dist == "balanced"

    # --- all-reduce -----------------------------------------------------------------------------------

    def _build_all_reduce(self, tp: int, eager: bool) -> LogCurve | None:
        found = self.files.get("all_reduce")
        if found is None:
            return None
        df = read_table(str(found[1]))
        df = df[(df["num_gpus"] == tp) & (df["kernel_source"].str.endswith("eager" if eager else "graph"))]
        if df.empty:
            return None
        # message_size counts elements of allreduce_dtype.
        df = df.assign(nbytes=df["message_size"] * df["allreduce_dtype"].map(DTYPE_BYTES).fillna(2))
        return LogCurve.of(*mean_points(df, "nbytes"))


def _exponent(distribution: str) -> float | None:
    """A table distribution's skew: 0 for balanced, alpha for power_law_<alpha>, None for any other."""
    if distribution == "balanced":
        return 0.0
    head, _, alpha = distribution.rpartition("_")
    try:
        return float(alpha) if head == "power_law" else None
    except ValueError:
        return None


# --- the extract kept in the repository (data/aic_extract), for fits and tests without the package ------
