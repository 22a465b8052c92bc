"""`sim plan --plots DIR`: each configuration's latency against offered rate (what the search saw), the
cost frontier (max rate against cost per million output tokens), and the throughput/interactivity Pareto
front (output tokens/s per replica against tokens/s per user, at each configuration's max rate)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sim.plan.search import ConfigResult
from sim.plan.table import PlanRow
from sim.report.summary import SLO
from traces.outputs import save_png

if TYPE_CHECKING:
    from types import ModuleType

MAX_CURVES = 12


def write_plan_plots(rows: list[PlanRow], results: dict[str, ConfigResult], slos: list[SLO],
                     swept: list[str], out_dir: str | Path, title: str = "") -> list[Path]:
    """latency_vs_rate.png (one panel per SLO, the top-ranked configurations), cost_frontier.png and
    pareto.png; `title` (workload, model, hardware, cost model) heads each figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, axes = plt.subplots(1, len(slos), figsize=(6 * len(slos), 4), squeeze=False)
    for ax, slo in zip(axes[0], slos):
        for row in rows[:MAX_CURVES]:
            points = [p for p in results[row.config.key].points if slo.label in p]
            if points:
                ax.plot([p["rate"] for p in points], [min(p[slo.label], 1e6) * 1e3 for p in points], marker=".",
                        label=row.config.label(swept))
        ax.axhline(slo.threshold_s * 1e3, color="k", ls="--", lw=0.8)
        ax.set(title=slo.label, xlabel="offered rate (req/s)", ylabel="ms", xscale="log", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, out / "latency_vs_rate.png")
    plt.close(fig)
    written.append(out / "latency_vs_rate.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    priced = [r for r in rows if r.usd_per_m_output_tokens is not None and r.max_rate > 0]
    if priced:
        ax.scatter([r.max_rate for r in priced], [r.usd_per_m_output_tokens for r in priced], s=12)
        frontier, best = [], float("inf")
        for r in sorted(priced, key=lambda r: (-r.max_rate, r.usd_per_m_output_tokens)):
            if r.usd_per_m_output_tokens < best:
                best = r.usd_per_m_output_tokens
                frontier.append(r)
        ax.plot([r.max_rate for r in frontier], [r.usd_per_m_output_tokens for r in frontier], "r-",
                label="frontier: cheapest at or above this rate")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no prices (--price HW=$/h)", ha="center", transform=ax.transAxes)
    ax.set_title(f"cost frontier\n{title}", fontsize=9)
    ax.set(xlabel="max rate within SLOs (req/s)", ylabel="$ per million output tokens")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out / "cost_frontier.png")
    plt.close(fig)
    written.append(out / "cost_frontier.png")
    written.append(_pareto(rows, swept, out, title, plt))
    return written


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on each), by x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def _pareto(rows: list[PlanRow], swept: list[str], out: Path, title: str, plt: ModuleType) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    usable = [r for r in rows if r.user_tok_s and r.max_rate > 0]
    pts = [(r.user_tok_s, r.output_tok_s_per_replica) for r in usable]
    if pts:
        ax.scatter(*zip(*pts), s=14)
        front = pareto_front(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "r-", label="Pareto front")
        mid = (min(p[0] for p in pts) + max(p[0] for p in pts)) / 2
        for i in front:
            right = pts[i][0] > mid
            ax.annotate(usable[i].config.label(swept), pts[i], fontsize=6, xytext=(-3 if right else 3, 3),
                        textcoords="offset points", ha="right" if right else "left")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no configuration met the SLOs", ha="center", transform=ax.transAxes)
    ax.set_title(f"throughput vs interactivity at each max rate\n{title}", fontsize=9)
    ax.set(xlabel="tokens/s per user (1 / median TPOT)", ylabel="output tokens/s per replica")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out / "pareto.png")
    plt.close(fig)
    return out / "pareto.png"
