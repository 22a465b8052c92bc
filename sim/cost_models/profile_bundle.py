"""Kernel times measured on the target GPU: a profile bundle in the layout of the public ones
(LLMServingSim's profiler): `meta.yaml`, then per tensor-parallel degree `tp<N>/dense.csv`
(`layer,tokens,time_us`), `attention.csv` (`prefill_chunk,kv_prefill,n_decode,kv_decode,time_us`: one
attention call of a mixed batch), `per_sequence.csv` (`layer,sequences,time_us`: LM head, sampler) and
`skew_fit.csv` (how much of the gap between attention at the decodes' mean and at their longest context
an uneven batch pays). Each `tp<N>` table is one rank's kernels at that degree, without communication.
A mixture of experts adds `tp1/moe.csv` (`tokens,activated_experts,time_us`: one layer's fused MoE block,
router included, on one GPU holding every expert). A table that `meta.yaml` marks as not run
(`skew_fit: {enabled: false}`) is left out, with a note.

Between grid points times are interpolated linearly in log-log space (kernel times follow power laws
piecewise); beyond the grid, dense and per-sequence times grow in proportion to the tokens, attention is
clamped to the nearest measured shape, and the cost model warns once with the count.
"""
from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.bounded_read import read_mapping
from sim.cost_models.kernels import AttentionShape, MoeCall

MAX_TABLE_BYTES = 64 << 20
MAX_META_BYTES = 1 << 20
_DENSE_COLUMNS = ("layer", "tokens", "time_us")
_ATTENTION_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
_SKEW_COLUMNS = ("pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label", "alpha")
_MOE_COLUMNS = ("tokens", "activated_experts", "time_us")


class BundleError(ValueError):
    """A bundle that cannot be read; the message is one line naming the file, row and field."""


def _coord(x: float) -> float:
    """Grid coordinate: log of (1 + x), so the zero rows (no prefill, no decodes) sit on the same axis."""
    return math.log1p(x)


@dataclass(slots=True)
class Curve:
    """Measured (x, time) points of one kernel along one axis, interpolated in log-log space."""

    xs: list[float]
    log_t: list[float]
    coords: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.coords = [_coord(x) for x in self.xs]

    def at(self, x: float) -> tuple[float, bool]:
        """(seconds, inside the grid); past the last point time grows in proportion to x."""
        xs = self.xs
        if x >= xs[-1]:
            t = math.exp(self.log_t[-1])
            return (t * x / xs[-1], x == xs[-1]) if xs[-1] > 0 else (t, False)
        if x <= xs[0]:
            return math.exp(self.log_t[0]), x == xs[0]
        i = bisect.bisect_right(xs, x)
        c0, c1 = self.coords[i - 1], self.coords[i]
        w = (_coord(x) - c0) / (c1 - c0)
        return math.exp(self.log_t[i - 1] + w * (self.log_t[i] - self.log_t[i - 1])), True


class GridTree:
    """A nested grid (prefill chunk -> cached prefix -> decodes -> decode context): the profiled points
    need not form a full product, so each level brackets the value among the keys measured under the
    level above, and interpolates between the two brackets in log space."""

    def __init__(self, rows: list[tuple[int, int, int, int, float]]) -> None:
        tree: dict = {}
        for pc, kvp, nd, kvd, t in rows:
            tree.setdefault(pc, {}).setdefault(kvp, {}).setdefault(nd, {})[kvd] = math.log(t)
        self.root = self._freeze(tree)

    def _freeze(self, node: Any) -> Any:
        if isinstance(node, dict):
            keys = sorted(node)
            return keys, [_coord(k) for k in keys], [self._freeze(node[k]) for k in keys]
        return node

    def at(self, point: tuple[int, int, int, int]) -> tuple[float, bool]:
        """(seconds, inside the grid)."""
        log_t, inside = self._at(self.root, point, 0)
        return math.exp(log_t), inside

    def _at(self, node: Any, point: tuple[int, ...], depth: int) -> tuple[float, bool]:
        if not isinstance(node, tuple):
            return node, True
        keys, coords, children = node
        x = point[depth]
        if x <= keys[0] or x >= keys[-1] or len(keys) == 1:
            j = 0 if x <= keys[0] else len(keys) - 1
            v, inside = self._at(children[j], point, depth + 1)
            return v, inside and x == keys[j]
        i = bisect.bisect_right(keys, x)
        lo, lo_in = self._at(children[i - 1], point, depth + 1)
        if keys[i - 1] == x:
            return lo, lo_in
        hi, hi_in = self._at(children[i], point, depth + 1)
        w = (_coord(x) - coords[i - 1]) / (coords[i] - coords[i - 1])
        return lo + w * (hi - lo), lo_in and hi_in


def _read_csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        if path.stat().st_size > MAX_TABLE_BYTES:
            raise BundleError(f"{path}: larger than {MAX_TABLE_BYTES >> 20} MiB, not a profile table")
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise BundleError(f"{path}: missing column {missing[0]!r} (expected {', '.join(columns)})")
            return list(reader)
    except OSError as e:
        raise BundleError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise BundleError(f"{path}: not a CSV table ({e})") from None


def _number(path: Path, row: int, name: str, text: str, integer: bool) -> float:
    try:
        v = int(text) if integer else float(text)
    except (TypeError, ValueError):
        raise BundleError(f"{path}: row {row}: {name} is not a{'n integer' if integer else ' number'}: "
                          f"{text!r}") from None
    positive = name in ("time_us", "tokens", "sequences")
    if not math.isfinite(v) or v < 0 or (positive and v <= 0):
        raise BundleError(f"{path}: row {row}: {name} must be {'> 0' if positive else '>= 0'}, got {text}")
    return v


def _curves(path: Path, x_name: str) -> dict[str, Curve]:
    points: dict[str, dict[int, float]] = {}
    for i, r in enumerate(_read_csv(path, ("layer", x_name, "time_us")), start=2):
        x = int(_number(path, i, x_name, r[x_name], True))
        t = _number(path, i, "time_us", r["time_us"], False) * 1e-6
        points.setdefault(r["layer"], {})[x] = t
    if not points:
        raise BundleError(f"{path}: no rows")
    return {op: Curve(sorted(p), [math.log(p[x]) for x in sorted(p)]) for op, p in points.items()}


def _label(bins: list[float], labels: list[str], x: float) -> str:
    """The label of the (lo, hi] bin x falls in, as pandas.cut would name it."""
    i = bisect.bisect_left(bins, x) - 1
    return labels[min(max(i, 0), len(labels) - 1)]


class ProfileKernels:
    """`KernelTimes` from one `tp<N>/` directory of a bundle; counts the lookups that left the grid."""

    def __init__(self, bundle: Path, tp: int = 1) -> None:
        self.bundle = Path(bundle)
        self.meta = read_bundle_meta(self.bundle)
        self.tp = tp
        d = self.bundle / f"tp{tp}"
        degrees = sorted(int(p.name[2:]) for p in self.bundle.glob("tp*") if p.name[2:].isdigit())
        if not d.is_dir():
            raise BundleError(f"{self.bundle}: no tp{tp}/ tables (profiled tensor-parallel sizes: "
                              f"{', '.join(map(str, degrees)) or 'none'})")
        self.dense_curves = _curves(d / "dense.csv", "tokens")
        self.sequence_curves = _curves(d / "per_sequence.csv", "sequences")
        rows = []
        path = d / "attention.csv"
        for i, r in enumerate(_read_csv(path, _ATTENTION_COLUMNS), start=2):
            pc, kvp, nd, kvd = (int(_number(path, i, c, r[c], True)) for c in _ATTENTION_COLUMNS[:4])
            rows.append((pc, kvp, nd, kvd, _number(path, i, "time_us", r["time_us"], False) * 1e-6))
        if not rows:
            raise BundleError(f"{path}: no rows")
        self.grid = GridTree(rows)
        self.notes: list[str] = []
        self._skew = self._read_skew(d / "skew_fit.csv")
        self._moe = self._read_moe(self.bundle / "tp1" / "moe.csv")
        self.outside = 0
        self.source = f"profile bundle {self.bundle}"

    def _read_moe(self, path: Path) -> list[tuple[float, Curve]] | None:
        """moe.csv as one token curve per count of activated experts, ascending."""
        if not path.is_file():
            return None
        points: dict[int, dict[int, float]] = {}
        for i, r in enumerate(_read_csv(path, _MOE_COLUMNS), start=2):
            tokens = int(_number(path, i, "tokens", r["tokens"], True))
            experts = int(_number(path, i, "activated_experts", r["activated_experts"], True))
            if experts < 1:
                raise BundleError(f"{path}: row {i}: activated_experts must be > 0, got {experts}")
            points.setdefault(experts, {})[tokens] = _number(path, i, "time_us", r["time_us"], False) * 1e-6
        if not points:
            raise BundleError(f"{path}: no rows")
        return [(float(a), Curve(sorted(p), [math.log(p[x]) for x in sorted(p)])) for a, p in sorted(points.items())]

    def _read_skew(self, path: Path) -> dict[tuple, float] | None:
        fit = (self.meta.get("skew_fit") or {})
        if fit.get("enabled") is False:
            self.notes.append("meta.yaml marks skew_fit as not run: attention of decodes with uneven contexts is "
                              "priced at their mean context")
            return None
        if not path.is_file():
            return None
        per_tp = (fit.get("per_tp") or {}).get(self.tp) or (fit.get("per_tp") or {}).get(str(self.tp)) or {}
        self.alpha_default = float(per_tp.get("alpha_default") or 0.0)
        if not math.isfinite(self.alpha_default):
            raise BundleError(f"{self.bundle / 'meta.yaml'}: skew_fit.per_tp.{self.tp}.alpha_default must be finite")
        axes = fit.get("bucket_axes") or {}
        try:
            self._bins = {k: ([float(b) for b in axes[f"{k}_bins"]], list(axes[f"{k}_labels"]))
                          for k in ("n", "skew_rate", "kv_big", "kp")}
        except (KeyError, TypeError, ValueError):
            raise BundleError(f"{self.bundle / 'meta.yaml'}: skew_fit.bucket_axes: needs n, skew_rate, kv_big and "
                              "kp bins and labels to read skew_fit.csv") from None
        table = {}
        for i, r in enumerate(_read_csv(path, _SKEW_COLUMNS), start=2):
            key = (int(_number(path, i, "pc", r["pc"], True)), r["n_label"], r["skew_rate_label"], r["kv_big_label"],
                   r["kp_label"])
            try:
                alpha = float(r["alpha"])
            except ValueError:
                raise BundleError(f"{path}: row {i}: alpha is not a number: {r['alpha']!r}") from None
            if not math.isfinite(alpha):
                raise BundleError(f"{path}: row {i}: alpha must be finite, got {r['alpha']}")
            table[key] = alpha
        self._skew_pcs = sorted({k[0] for k in table})
        return table

    def _at(self, curves: dict[str, Curve], op: str, x: int) -> float:
        """The op's measured time at x (0 for an op the bundle did not profile), counting lookups past the grid."""
        curve = curves.get(op)
        if curve is None:
            return 0.0
        t, inside = curve.at(x)
        self.outside += not inside
        return t

    def dense(self, op: str, tokens: int) -> float:
        return self._at(self.dense_curves, op, tokens)

    def per_sequence(self, op: str, sequences: int) -> float:
        return self._at(self.sequence_curves, op, sequences)

    def attention(self, shape: AttentionShape) -> float:
        t, inside = self.grid.at((shape.prefill_chunk, shape.kv_prefill, shape.n_decode, shape.kv_decode))
        self.outside += not inside
        return t

    def skew_alpha(self, shape: AttentionShape, kv_min: int, kv_max: int) -> float:
        """The share of t(kv_max) - t(kv_mean) an uneven decode batch pays, from the bucket its shape falls in
        (the batch read as a two-point mix of its shortest and longest contexts with the same mean)."""
        if self._skew is None or kv_max <= kv_min:
            return 0.0
        ratio = (shape.kv_decode - kv_min) / (kv_max - kv_min)
        pc = min(self._skew_pcs, key=lambda p: abs(p - shape.prefill_chunk))
        b = self._bins
        key = (pc, _label(*b["n"], shape.n_decode), _label(*b["skew_rate"], ratio), _label(*b["kv_big"], kv_max),
               _label(*b["kp"], shape.kv_prefill))
        return self._skew.get(key, self.alpha_default)

    def all_reduce_time(self, nbytes: float, tp: int) -> None:
        """The bundles time each rank alone: communication is priced from the hardware's link."""
        return None

    def moe(self, call: MoeCall) -> float:
        """moe.csv at the pairs the rank computes (as `tokens x share` tokens of the profiled full block) and
        its activated experts, interpolated in log-log space between the two measured expert counts around
        it; below the fewest measured, time in proportion to the experts (each one's weights are the read);
        an expert split `width_split` ways costs that share."""
        if self._moe is None:
            raise ValueError(f"{self.bundle}: no tp1/moe.csv, so this bundle cannot price a mixture of experts")
        tokens, activated = max(call.tokens * call.share, 1e-9), max(call.activated, 1e-9)
        levels = self._moe
        i = bisect.bisect_left([a for a, _ in levels], activated)
        if i == 0:
            t, inside = levels[0][1].at(tokens)
            t, inside = t * min(activated / levels[0][0], 1.0), inside and activated == levels[0][0]
        elif i == len(levels):
            t, inside = levels[-1][1].at(tokens)
            t, inside = t * activated / levels[-1][0], False
        else:
            (a0, c0), (a1, c1) = levels[i - 1], levels[i]
            t0, in0 = c0.at(tokens)
            t1, in1 = c1.at(tokens)
            w = (math.log(activated) - math.log(a0)) / (math.log(a1) - math.log(a0))
            t, inside = math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))), in0 and in1
        self.outside += not inside
        return t / call.width_split

    def caveats(self) -> list[str]:
        return list(self.notes)

    def describe(self) -> dict[str, Any]:
        m = self.meta
        return {"bundle": str(self.bundle), "tp": self.tp, "gpu": m.get("gpu"), "hardware": m.get("hardware"),
                "model": m.get("model"), "variant": m.get("variant"), "vllm_version": m.get("vllm_version"),
                "profiled_at": str(m.get("profiled_at")), "enforce_eager": (m.get("engine_effective") or {}).get(
                    "enforce_eager"), "max_tokens": max(c.xs[-1] for c in self.dense_curves.values()),
                "moe_table": self._moe is not None, "notes": list(self.notes)}


def read_bundle_meta(bundle: Path) -> dict[str, Any]:
    path = Path(bundle) / "meta.yaml"
    if not path.exists():
        raise BundleError(f"{bundle}: not a profile bundle (no meta.yaml)")
    try:
        return read_mapping(path, MAX_META_BYTES, "bundle's meta.yaml", "yaml")
    except ValueError as e:
        raise BundleError(str(e)) from None


def is_bundle(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "meta.yaml").is_file()
