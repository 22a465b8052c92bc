"""What a replay prints and draws: traces.summary's headline metrics plus inter-token latency, goodput
under SLOs and KV usage; latency CDFs and throughput / queue / KV curves as PNGs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from sim.report.token_stats import TokenStats, stream_token_stats, token_times
from traces.outputs import save_png
from traces.schema import REQUEST_COLUMNS
from traces.metrics import LATENCIES, SLO, UNFINISHED_POLICY, evaluate_slos, request_latencies
from traces.metrics import inter_token_latencies as itl_of
from traces.summary import format_summary, summarize

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from pandas.api.extensions import ExtensionArray

    from traces import Trace

def inter_token_latencies(decisions: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    return itl_of(*token_times(decisions, steps))


# What the summary and the plots read: no token id lists, no block tables, and only these step columns.
SUMMARY_READ = {
    "steps": ("step", "start", "end", "num_prefill_tokens", "num_running", "num_waiting", "kv_blocks_used",
              "kv_blocks_total", "prefix_hit_tokens"),
    "requests": tuple(c for c in REQUEST_COLUMNS if not c.endswith("token_ids")),
    "decisions": ("step", "request_id", "event", "phase"),
}


@dataclass(slots=True)
class SummaryTrace:
    """What the summary and the plots read of a trace: the summary columns of its requests and steps, and
    its decisions already reduced to TokenStats."""

    path: Path
    meta: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    tokens: TokenStats


class HasRequests(Protocol):
    """What request_metrics reads of a loaded trace: its requests table."""

    requests: pd.DataFrame


class TraceTables(HasRequests, Protocol):
    """What the summary reads of a trace loaded whole (a `traces.Trace`, or any object with these tables)."""

    steps: pd.DataFrame
    decisions: pd.DataFrame


def load_for_summary(path: str | Path) -> SummaryTrace:
    """Requests and steps as the summary reads them (their columns only, request ids as Categoricals), and
    the decisions walked a record batch at a time into TokenStats: a 200k-request replay's ~15M decision
    rows are never held at once. Compacted or still streamed (a run cut short) alike."""
    import warnings

    import pyarrow as pa

    import traces
    from traces.batches import table_batches

    cats = ("request_id", "event", "phase")
    _release_memory()
    trace = traces.load(path, columns=SUMMARY_READ, tables=("steps", "requests"), categories=cats)
    steps = trace.steps
    # A run cut short: its decisions beyond the last steps row are dropped, as traces.load drops them.
    last = None if trace.meta.get("complete") else (int(steps["step"].max()) if len(steps) else -1)
    batches = table_batches(path, "decisions", SUMMARY_READ["decisions"], dictionary=cats)
    try:
        tokens = stream_token_stats(batches, steps, last, _ids(trace.requests), batches.num_rows)
    except pa.ArrowInvalid:
        tokens = None  # JSON lines the schema cannot type: traces.load reads them row by row
    if batches.truncated[0]:
        warnings.warn(f"{trace.path}: trace ends mid-write (decisions); read up to the last complete step",
                      traces.TruncatedTraceWarning, stacklevel=2)
    if tokens is None:  # rows out of step order: sorted in memory, the whole table at once
        full = traces.load(path, columns=SUMMARY_READ, tables=SUMMARY_READ, categories=cats)
        tokens = TokenStats.from_token_times(*token_times(full.decisions, full.steps))
    _release_memory()
    return SummaryTrace(trace.path, trace.meta, trace.requests, steps, tokens)


def _release_memory() -> None:
    """Hand back what was freed before: the simulator's structures (reference cycles, which wait for a
    collection) and the pages Arrow's allocator (mimalloc) keeps for reuse after a trace's compaction or
    a read, ~130 MB after compacting a 200k-request replay, and glibc's free heap pages (a summary's
    per-batch arrays leave ~90 MB of them)."""
    import ctypes
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _ids(requests: pd.DataFrame) -> pd.Index | np.ndarray | ExtensionArray:
    ids = requests["request_id"]
    return ids.cat.categories if isinstance(ids.dtype, pd.CategoricalDtype) else ids.dropna().unique()


def token_stats(trace: SummaryTrace | TraceTables) -> TokenStats:
    """The trace's TokenStats: streamed by load_for_summary, else computed from its decisions in memory."""
    if isinstance(trace, SummaryTrace):
        return trace.tokens
    return TokenStats.from_token_times(*token_times(trace.decisions, trace.steps))


# request_metrics' names -> traces.summary's: latency is what the summary calls e2e.
REQUEST_METRICS = {"ttft": "ttft", "tpot": "tpot", "latency": "e2e"}


def request_metrics(trace: HasRequests | str | Path, percentiles: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    """TTFT, TPOT and latency in seconds over the finished requests, mean and percentiles (`ttft_mean`,
    `ttft_p50`, ..., `latency_p99`), with the definitions LLMServingSim and vLLM's benchmarks use, which are
    traces.summary's: TTFT = first_token - arrival, TPOT = (finish - first_token) / (output tokens - 1)
    over requests with more than one output token, latency = finish - arrival. `trace` is any loaded trace
    (requests alone will do) or a trace directory, of which only the requests are read."""
    if isinstance(trace, (str, Path)):
        import traces

        trace = traces.load(trace, columns=SUMMARY_READ, tables=("requests",))
    s = summarize(trace.requests, None, percentiles)
    out = {}
    for name, key in REQUEST_METRICS.items():
        out[f"{name}_mean"] = s[f"{key}_mean_s"]
        out.update({f"{name}_p{q}": s[f"{key}_p{q}_s"] for q in percentiles})
    return out


def sim_summary(trace: SummaryTrace | TraceTables, slos: list[SLO] | None = None,
                percentiles: tuple[int, ...] = (50, 90, 99)) -> dict[str, Any]:
    """traces.summary.summarize plus ITL, total token throughput, KV usage and goodput under `slos`;
    `trace` is load_for_summary's or a whole `traces.Trace`."""
    req, steps = trace.requests, trace.steps
    s = summarize(req, steps, percentiles)
    for q, v in zip(percentiles, token_stats(trace).itl_percentiles(percentiles)):
        s[f"itl_p{q}_s"] = v
    done = req[req["finish_reason"].isin(["stop", "length"])]
    total = int(done["num_prompt_tokens"].sum()) + s["output_tokens"]
    s["total_throughput_tok_s"] = total / s["duration_s"]
    if slos:
        verdict = evaluate_slos(req, slos)
        s["goodput_req_s"] = verdict.goodput_requests / s["duration_s"]
        s["slo_attainment"] = verdict.attainment
        s["slos"] = [{"slo": r.slo.label, "met_by_requests": r.met_by_requests, "measured_s": r.measured_s,
                      "met": r.met} for r in verdict.results]
    return s


def format_sim_summary(s: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = s.get(key, math.nan)
        return "n/a" if v != v else f"{v * 1e3:.1f} ms"

    lines = [format_summary(s),
             f"itl: p50 {ms('itl_p50_s')}, p90 {ms('itl_p90_s')}, p99 {ms('itl_p99_s')}",
             f"ttft p90 {ms('ttft_p90_s')}, tpot p90 {ms('tpot_p90_s')}, e2e p90 {ms('e2e_p90_s')}",
             f"total throughput: {s['total_throughput_tok_s']:.1f} tok/s, {s['request_throughput_req_s']:.2f} req/s"]
    if "goodput_req_s" in s:
        lines.append(f"goodput: {s['goodput_req_s']:.2f} req/s "
                     f"({s['slo_attainment'] * 100:.1f}% of requests meet all SLOs; {UNFINISHED_POLICY})")
        for a in s["slos"]:
            measured = ("" if a["measured_s"] != a["measured_s"] else
                        ", measured: among the unfinished" if math.isinf(a["measured_s"]) else
                        f", measured {a['measured_s'] * 1e3:.1f} ms")
            lines.append(f"  {a['slo']}: {a['met_by_requests'] * 100:.1f}% of requests{measured}"
                         f"{' met' if a['met'] else ' MISSED'}")
    return "\n".join(lines)


def write_plots(trace: SummaryTrace | Trace, out_dir: str | Path, bins: int = 200,
                slos: list[SLO] | None = None) -> list[Path]:
    """Latency CDFs, output throughput, queue lengths and KV usage over simulated time, as PNGs, each
    titled with what was simulated; `slos` draw their thresholds and percentiles on the CDFs."""
    from traces.describe import describe_run

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps, written, tokens = trace.steps, [], token_stats(trace)
    lat = request_latencies(trace.requests)
    series = {"ttft": lat["ttft"].to_numpy(float), "tpot": lat["tpot"].to_numpy(float),
              "e2e": lat["e2e"].to_numpy(float), "itl": tokens.itl}

    workload = (trace.meta.get("workload") or {}).get("name")
    title = " · ".join(x for x in (workload, describe_run(trace.meta)) if x)

    def save(fig: Figure, name: str) -> None:
        path = out / name
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        save_png(fig, path)
        plt.close(fig)
        written.append(path)

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    for ax, (name, v) in zip(axes, series.items()):
        v = np.sort(v[~np.isnan(v)])
        if len(v):
            ax.plot(v * 1e3, np.arange(1, len(v) + 1) / len(v))
        for slo in slos or []:
            if slo.metric == name:
                ax.axvline(slo.threshold_s * 1e3, color="r", ls="--", lw=0.8, label=slo.label)
                ax.axhline((slo.percentile or 100) / 100, color="r", ls=":", lw=0.6)
                ax.legend(fontsize=7)
        ax.set(title=f"{name} CDF", xlabel="ms", ylabel="fraction of " + ("tokens" if name == "itl" else "requests"))
        ax.grid(alpha=0.3)
    save(fig, "latency_cdf.png")

    end = steps["end"].to_numpy(float)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if len(tokens.times):
        # At least ~20 steps per bin, or the curve aliases against the step rhythm.
        counts, edges = tokens.histogram(max(1, min(bins, len(steps) // 20)))
        ax.plot(edges[:-1], counts / np.diff(edges))
    ax.set(title="output throughput", xlabel="simulated time (s)", ylabel="tokens/s")
    ax.grid(alpha=0.3)
    save(fig, "throughput.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(end, steps["num_running"].to_numpy(), label="running", lw=0.8)
    # Drawn last and dashed: where nobody waits it would otherwise lie hidden under the running line.
    ax.plot(end, steps["num_waiting"].to_numpy(), label="waiting", lw=1.0, ls="--", zorder=3)
    ax.set(title="queue length", xlabel="simulated time (s)", ylabel="requests")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "queues.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    total = steps["kv_blocks_total"].to_numpy(float)
    ax.plot(end, 100 * steps["kv_blocks_used"].to_numpy(float) / np.maximum(total, 1), lw=0.8)
    ax.set(title="KV cache usage", xlabel="simulated time (s)", ylabel="% of blocks", ylim=(0, 105))
    ax.grid(alpha=0.3)
    save(fig, "kv_usage.png")
    return written


def metric_label(name: str) -> tuple[str, float, str]:
    """A summary key as printed, with the scale and unit its values are printed in: `ttft_p50_s` is
    `ttft p50` in ms, `output_throughput_tok_s` is `output throughput` in tok/s."""
    for suffix, unit in (("_tok_s", "tok/s"), ("_req_s", "req/s")):
        if name.endswith(suffix):
            return name.removesuffix(suffix).replace("_", " "), 1.0, unit
    base = name.removesuffix("_s").replace("_", " ")
    return (base, 1e3, "ms") if name.split("_")[0] in (*LATENCIES, "itl", "queue") else (base, 1.0, "s")
