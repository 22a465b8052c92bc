"""`sim compare A B --plots DIR`: QQ plots of TTFT and inter-token latency, B (predicted) against A
(measured). Points on the diagonal are quantiles the replay got right; a bend shows which part of the
distribution (body or tail) it misses, which the percentile table alone hides."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.report.summary import inter_token_latencies
from traces.outputs import save_png
from traces.metrics import request_latencies

if TYPE_CHECKING:
    from traces import Trace

QUANTILES = np.linspace(0.01, 0.99, 99)


def latency_samples(trace: Trace) -> dict[str, np.ndarray]:
    ttft = request_latencies(trace.requests)["ttft"].to_numpy(float)
    return {"ttft": ttft[~np.isnan(ttft)], "itl": inter_token_latencies(trace.decisions, trace.steps)}


def write_qq_plots(a: Trace, b: Trace, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sa, sb = latency_samples(a), latency_samples(b)
    name_a, name_b = Path(str(a.path)).name, Path(str(b.path)).name
    written = []
    for name, title in (("ttft", "TTFT"), ("itl", "inter-token latency")):
        fig, ax = plt.subplots(figsize=(5, 5))
        if len(sa[name]) and len(sb[name]):
            qa, qb = np.quantile(sa[name], QUANTILES) * 1e3, np.quantile(sb[name], QUANTILES) * 1e3
            ax.scatter(qa, qb, s=10)
            for q in (49, 89):  # p50 and p90
                ax.annotate(f"p{q + 1}", (qa[q], qb[q]), fontsize=8)
            lo, hi = min(qa.min(), qb.min()), max(qa.max(), qb.max())
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
            if lo > 0:  # latencies span decades: linear axes crowd every quantile but the tail into a corner
                ax.set_xscale("log")
                ax.set_yscale("log")
        ax.set(title=f"{title} quantiles, B against A", xlabel=f"A: {name_a}, {name} ms",
               ylabel=f"B: {name_b}, {name} ms")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{name}_qq.png"
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written
