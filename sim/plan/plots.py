"""`sim plan --plots DIR`: each configuration's latency against offered rate (what the search saw), the
cost frontier (max rate against cost per million output tokens), and the throughput/interactivity Pareto
front (output tokens/s per replica against tokens/s per user, at each configuration's max rate).

A plot with nothing to show is not written (no cost frontier without `--price`), and legends sit outside
the axes, so that no curve or point hides behind one."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.plan.search import ConfigResult
from sim.plan.table import PlanRow
from traces.metrics import SLO
from traces.outputs import save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_CURVES = 20
# A percentile that falls among unfinished requests is null (sim.plan.search.slo_check), or huge in an older
# results file; nothing that finished is this late.
UNFINISHED_S = 1e9
# Line styles, as matplotlib keyword arguments.
FAILED_MARK: dict[str, Any] = dict(marker="x", ls="none", ms=6, mew=1.5, clip_on=False)
FRONT_MARK: dict[str, Any] = dict(marker="o", mfc="none", ms=8)  # a front of one point is still seen
FAILED_ROW = 0.04  # axes fraction between configurations' rows of failed rates


def write_plan_plots(rows: list[PlanRow], results: dict[str, ConfigResult], slos: list[SLO],
                     swept: list[str], out_dir: str | Path, title: str = "") -> list[Path]:
    """latency_vs_rate.png (one panel per SLO, the top-ranked configurations), cost_frontier.png (with
    prices) and pareto.png (when a configuration met the SLOs): the paths written; `title` (workload,
    model, hardware, cost model) heads each figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in (("latency_vs_rate.png", latency_figure(rows, results, slos, swept, title)),
                      ("cost_frontier.png", cost_figure(rows, swept, title)),
                      ("pareto.png", pareto_figure(rows, swept, title))):
        if fig is None:
            continue
        save_png(fig, out / name)
        plt.close(fig)
        written.append(out / name)
    return written


def fitted(title: str, fig: Figure) -> str:
    """The title wrapped to the axes' width, so no part of it is cut at the figure's edge."""
    import textwrap

    return textwrap.fill(title, width=max(40, int((fig.get_figwidth() - 3) * 12)))  # less the legend's width


def curve_color(i: int) -> Any:
    """One of 20 distinct colours: MAX_CURVES curves never share one (the default cycle repeats after 10)."""
    import matplotlib

    return matplotlib.colormaps["tab20"]((2 * i + i // 10) % 20)  # dark shades first, then the light ones


def split_points(points: list[dict[str, Any]], label: str) -> tuple[list[tuple[float, float]], list[float]]:
    """A configuration's points on one SLO: (rate, latency in s) where every request finished, and the
    rates where some did not (the percentile is null: it fell among the unfinished) or the simulation
    failed, which have no latency to draw."""
    finite, failed = [], []
    for p in points:
        v = p.get(label)
        if label not in p and "error" not in p:
            continue
        if v is None or not math.isfinite(v) or v >= UNFINISHED_S:
            failed.append(p["rate"])
        else:
            finite.append((p["rate"], v))
    return finite, failed


def latency_figure(rows: list[PlanRow], results: dict[str, ConfigResult], slos: list[SLO], swept: list[str],
                   title: str) -> Figure | None:
    """One panel per SLO: each configuration's measured latency at each rate the search tried and the SLO
    as a dashed line. A rate where requests did not finish has no latency: it is an x in a shaded band on
    top, a row per configuration, and the y axis spans the finite latencies only. None when no
    configuration has a point."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import blended_transform_factory

    ranked = [(rank, r) for rank, r in enumerate(rows[:MAX_CURVES], 1) if results[r.config.key].points]
    shown = [r for _, r in ranked]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(slos), figsize=(5 * len(slos) + 2.5, 4.2), squeeze=False, layout="constrained")
    any_failed = False
    for ax, slo in zip(axes[0], slos):
        split = [split_points(results[r.config.key].points, slo.label) for r in shown]
        failing = [i for i, (_, failed) in enumerate(split) if failed]
        band = min(0.05 + FAILED_ROW * len(failing), 0.4) if failing else 0.0
        top = blended_transform_factory(ax.transData, ax.transAxes)
        for i, (finite, _) in enumerate(split):
            if finite:
                ax.plot([r for r, _ in finite], [v * 1e3 for _, v in finite], marker=".", color=curve_color(i))
        spacing = min(FAILED_ROW, (band - 0.05) / max(len(failing) - 1, 1))  # every row inside the band
        for row, i in enumerate(failing):
            failed = split[i][1]
            ax.plot(failed, [1 - 0.03 - spacing * row] * len(failed), color=curve_color(i), transform=top,
                    **FAILED_MARK)
        ax.axhline(slo.threshold_s * 1e3, color="k", ls="--", lw=0.8)
        ax.set(title=slo.label, xlabel="offered rate (req/s)", ylabel="ms", xscale="log", yscale="log")
        finite_ms = [v * 1e3 for finite, _ in split for _, v in finite] + [slo.threshold_s * 1e3]
        lo, hi = min(finite_ms) / 1.15, max(finite_ms) * 1.15
        if failing:  # the finite latencies end below the band
            hi = lo * (hi / lo) ** (1 / (1 - band))
            ax.add_patch(Rectangle((0, 1 - band), 1, band, transform=ax.transAxes, color="0.92", zorder=0, lw=0))
            any_failed = True
        ax.set_ylim(lo, hi)
        _readable_log_ticks(ax, (slo.threshold_s * 1e3,), lo * (hi / lo) ** (1 - band))
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=curve_color(i), marker=".") for i in range(len(shown))]
    labels = [f"#{rank} {r.config.label(swept)}" + (f" (same as #{r.same_as})" if r.same_as else "")
              for rank, r in ranked]
    handles.append(Line2D([], [], color="k", ls="--", lw=0.8))
    labels.append("SLO")
    if any_failed:
        handles.append(Line2D([], [], color="0.3", **{k: v for k, v in FAILED_MARK.items() if k != "clip_on"}))
        labels.append("requests did not finish\n(top band, a row per\nconfiguration)")
    fig.legend(handles, labels, loc="outside right upper", fontsize=7)
    fig.suptitle(fitted(title, fig), fontsize=9, x=0.01, ha="left")  # clear of the legend on the right
    return fig


def _readable_log_ticks(ax: Any, extra_y: tuple[float, ...] = (), y_top: float = math.inf) -> None:
    """Plain numbers at round multiples of each power of ten within the limits (finer where the range is
    narrow), and at `extra_y`, in place of matplotlib's crowded 3x10^1 labels or a lone 10^1; no y label
    above `y_top` (the band of failed rates, where the y axis means nothing)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    y_lo, y_hi = ax.get_ylim()
    for axis, (lo, hi), extra in ((ax.xaxis, ax.get_xlim(), ()), (ax.yaxis, (y_lo, min(y_hi, y_top)), extra_y)):
        for steps in ((1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 6, 8)):
            ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                     for m in steps if lo <= m * 10.0 ** k <= hi]
            if len(ticks) >= 3:
                break
        ticks = sorted({*ticks, *(e for e in extra if lo <= e <= hi)})
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.4g}"))
        axis.set_minor_formatter(NullFormatter())


def cost_figure(rows: list[PlanRow], swept: list[str], title: str) -> Figure | None:
    """Max rate against cost per million output tokens, with the frontier of the cheapest configuration
    at or above each rate; None without prices (nothing to draw)."""
    import matplotlib.pyplot as plt

    priced = [(r, r.usd_per_m_output_tokens) for r in rows if r.usd_per_m_output_tokens is not None and r.max_rate > 0]
    if not priced:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
    ax.scatter([r.max_rate for r, _ in priced], [usd for _, usd in priced], s=12, label="configuration")
    frontier: list[tuple[PlanRow, float]] = []
    best = float("inf")
    for r, usd in sorted(priced, key=lambda p: (-p[0].max_rate, p[1])):
        if usd < best:
            best = usd
            frontier.append((r, usd))
    frontier.reverse()
    ax.plot([r.max_rate for r, _ in frontier], [usd for _, usd in frontier], "r-",
            drawstyle="steps-pre", label="frontier: cheapest at\nor above this rate", **FRONT_MARK)
    ax.margins(0.1)
    # From zero: a cost a fraction of a percent higher should look it.
    ax.set_ylim(0, max(usd for _, usd in priced) * 1.15)
    _label_points(ax, [(r.max_rate, usd) for r, usd in frontier], [r.config.label(swept) for r, _ in frontier])
    ax.set_title(f"cost frontier\n{fitted(title, fig)}", fontsize=9)
    ax.set(xlabel="max rate within SLOs (req/s)", ylabel="$ per million output tokens")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=7)
    return fig


def _label_points(ax: Any, points: list[tuple[float, float]], labels: list[str]) -> None:
    """Each point's configuration beside it, on the side facing the middle of the axes (set their limits
    first) so that none runs off them."""
    lo, hi = ax.get_xlim()
    mid = (lo + hi) / 2
    for i, ((x, y), label) in enumerate(zip(points, labels)):
        right, below = x > mid, i % 2 == 1  # neighbours alternate above and below, so close ones do not collide
        ax.annotate(label, (x, y), fontsize=7, xytext=(-5 if right else 5, -6 if below else 5),
                    textcoords="offset points", ha="right" if right else "left", va="top" if below else "bottom",
                    bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.5))


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on each), by x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def pareto_figure(rows: list[PlanRow], swept: list[str], title: str) -> Figure | None:
    """Output tokens/s per replica against tokens/s per user at each configuration's max rate, the front
    as a staircase (the most throughput at or above each tokens/s per user); None when no configuration
    met the SLOs."""
    import matplotlib.pyplot as plt

    usable = [(r, r.user_tok_s) for r in rows if r.user_tok_s and r.max_rate > 0]
    if not usable:
        return None
    pts = [(user, r.output_tok_s_per_replica) for r, user in usable]
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    ax.scatter([x for x, _ in pts], [y for _, y in pts], s=14, label="configuration at its max rate")
    front = pareto_front(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "r-", drawstyle="steps-pre",
            label="Pareto front: most throughput\nat or above this tokens/s per user", **FRONT_MARK)
    ax.margins(0.12)
    ax.set_ylim(0, max(y for _, y in pts) * 1.15)
    _label_points(ax, [pts[i] for i in front], [usable[i][0].config.label(swept) for i in front])
    ax.set_title(f"throughput vs interactivity at each max rate\n{fitted(title, fig)}", fontsize=9)
    ax.set(xlabel="tokens/s per user (1 / median TPOT)", ylabel="output tokens/s per replica")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=7)
    return fig
