"""`sim plan --plots DIR`: each configuration's latency against offered rate (what the search saw), and
the cost frontier (max rate against cost per million output tokens)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.report import SLO
from sim.sweep import config_key, config_label

MAX_CURVES = 12


def write_plan_plots(rows: list[dict[str, Any]], results: dict[str, dict[str, Any]], slos: list[SLO],
                     swept: list[str], out_dir: str | Path) -> list[Path]:
    """latency_vs_rate.png (one panel per SLO, the top-ranked configurations) and cost_frontier.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, axes = plt.subplots(1, len(slos), figsize=(6 * len(slos), 4), squeeze=False)
    for ax, slo in zip(axes[0], slos):
        for row in rows[:MAX_CURVES]:
            points = [p for p in results[config_key(row["config"])].get("points", []) if slo.label in p]
            if points:
                ax.plot([p["rate"] for p in points], [min(p[slo.label], 1e6) * 1e3 for p in points], marker=".",
                        label=config_label(row["config"], swept))
        ax.axhline(slo.threshold_s * 1e3, color="k", ls="--", lw=0.8)
        ax.set(title=slo.label, xlabel="offered rate (req/s)", ylabel="ms", xscale="log", yscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "latency_vs_rate.png", dpi=100)
    plt.close(fig)
    written.append(out / "latency_vs_rate.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    priced = [r for r in rows if r["usd_per_m_output_tokens"] is not None and r["max_rate"] > 0]
    if priced:
        ax.scatter([r["max_rate"] for r in priced], [r["usd_per_m_output_tokens"] for r in priced], s=12)
        frontier, best = [], float("inf")
        for r in sorted(priced, key=lambda r: (-r["max_rate"], r["usd_per_m_output_tokens"])):
            if r["usd_per_m_output_tokens"] < best:
                best = r["usd_per_m_output_tokens"]
                frontier.append(r)
        ax.plot([r["max_rate"] for r in frontier], [r["usd_per_m_output_tokens"] for r in frontier], "r-",
                label="frontier: cheapest at or above this rate")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no prices (--price HW=$/h)", ha="center", transform=ax.transAxes)
    ax.set(title="cost frontier", xlabel="max rate within SLOs (req/s)", ylabel="$ per million output tokens")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "cost_frontier.png", dpi=100)
    plt.close(fig)
    written.append(out / "cost_frontier.png")
    return written
