"""What `sim plan` prints: configurations ranked, the columns that mean different things, configurations
whose results are identical, and one recommendation for the offered rate."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from sim.plan.config import PlanConfig
from sim.plan.search import ConfigResult

RANKING = {True: "ranked by $ per million output tokens at each configuration's max rate (cheapest first), "
                 "then by max rate per replica",
           False: "ranked by max rate per replica (highest first); --price HW=$/h ranks by cost"}


@dataclass(slots=True, kw_only=True)
class PlanRow:
    """One configuration's line of the table: its search result and what follows from it at the max rate."""

    config: PlanConfig
    max_rate: float
    capped: bool
    goodput_req_s: float
    output_tok_s: float
    output_tok_s_per_replica: float
    user_tok_s: float | None
    usd_per_hour: float | None
    usd_per_m_output_tokens: float | None
    note: str | None
    rejected: dict[str, int]
    max_rate_interval: dict[str, Any] | None
    served_rate: float = 0.0
    attainment: float = 0.0
    prefix_hit_rate: float = 0.0
    same_as: int | None = None  # the rank of an earlier row with identical results

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "config": self.config.to_dict()}


def rank(results: list[tuple[PlanConfig, ConfigResult]], prices: dict[str, float]) -> list[PlanRow]:
    """Rows sorted cheapest first (unpriced after priced, then by rate per replica); cost per million
    output tokens = price/GPU-h x GPUs (replicas x tensor parallel size) / (rate x mean output tokens x 3600 s)
    x 1e6."""
    rows, fingerprints = [], {}
    for config, res in results:
        rate = res.max_rate
        tok_s = rate * res.mean_output_tokens
        price = prices.get(str(config.hardware).lower())
        cost = price * config.num_gpus / (tok_s * 3600) * 1e6 if price is not None and tok_s > 0 else None
        row = PlanRow(config=config, max_rate=rate, capped=res.capped, goodput_req_s=rate * res.attainment,
                      output_tok_s=tok_s, output_tok_s_per_replica=tok_s / config.replicas, user_tok_s=res.user_tok_s,
                      usd_per_hour=None if price is None else price * config.num_gpus, usd_per_m_output_tokens=cost,
                      note=res.note, rejected=res.rejected, max_rate_interval=res.max_rate_interval,
                      served_rate=res.served_rate, attainment=res.attainment, prefix_hit_rate=res.prefix_hit_rate)
        rows.append(row)
        fingerprints[id(row)] = _fingerprint(res)
    rows.sort(key=lambda r: (r.usd_per_m_output_tokens is None, r.usd_per_m_output_tokens or 0.0,
                             -r.max_rate / r.config.replicas, r.config.key))
    first: dict[str, int] = {}
    for i, row in enumerate(rows, 1):
        fp = fingerprints[id(row)]
        if fp is not None:
            row.same_as = first.get(fp)
            first.setdefault(fp, i)
    return rows


def _fingerprint(res: ConfigResult) -> str | None:
    """Configurations with the same answer: the same max rate and the same measurements there (e.g. a
    max_num_seqs above what the load ever reaches at that rate)."""
    if not res.max_rate:
        return None
    return json.dumps([res.max_rate, res.capped, res.attainment, res.mean_output_tokens, res.slo_measured,
                       res.user_tok_s], sort_keys=True, default=str)


def format_table(rows: list[PlanRow], swept: list[str], tol: float = 0.05) -> str:
    labels = [r.config.label(swept) for r in rows]
    priced = any(r.usd_per_m_output_tokens is not None for r in rows)
    width = max([len("configuration"), *map(len, labels)])
    hits = any(r.prefix_hit_rate > 0 for r in rows)
    head = (f"{'#':>3}  {'configuration':<{width}}  {'max rate':>9}  {'served':>8}  {'attain':>6}  "
            f"{'tok/s/replica':>13}  {'tok/s/user':>10}" + (f"  {'hit':>5}" if hits else ""))
    lines = [head + (f"  {'$/M out tok':>11}" if priced else "")]
    for i, (row, label) in enumerate(zip(rows, labels), 1):
        rate = (">=" if row.capped else "") + f"{row.max_rate:.3f}"
        user = "n/a" if row.user_tok_s is None else f"{row.user_tok_s:.1f}"
        line = (f"{i:>3}  {label:<{width}}  {rate:>9}  {row.served_rate:>8.3f}  {row.attainment * 100:>5.1f}%  "
                f"{row.output_tok_s_per_replica:>13.1f}  {user:>10}")
        if hits:
            line += f"  {row.prefix_hit_rate * 100:>4.1f}%"
        if priced:
            cost = row.usd_per_m_output_tokens
            line += f"  {'n/a' if cost is None else f'{cost:.3f}':>11}"
        if row.same_as:
            line += f"  (same results as #{row.same_as})"
        if row.note:
            line += f"  ({row.note})"
        lines.append(line + _interval(row.max_rate_interval))
    lines.append("max rate: the highest arrival rate (requests/s) the deployment sustains in steady state: over "
                 "the measurement window it serves what it is offered and every SLO holds for the window's requests")
    lines.append("served: requests/s taken into service over the window at that rate; attain: share of the window's requests "
                 "meeting every SLO; tok/s/replica: output tokens/s per replica; tok/s/user: 1 / median TPOT"
                 + ("; hit: prompt tokens served from the prefix cache" if hits else ""))
    lines.append(RANKING[priced])
    return "\n".join(lines + scaling_lines(rows, swept, tol) + rejection_lines(rows, labels))


def scaling_lines(rows: list[PlanRow], swept: list[str], tol: float) -> list[str]:
    """Configurations that sustain more than their replica count times what one replica of them sustains
    (beyond the search's tolerance), explained where they are printed: a router that spreads requests splits
    the workload's clusters of close arrivals, which one replica queues whole."""
    from dataclasses import replace

    by_key = {r.config.key: r for r in rows}
    found: dict[str, list[str]] = {}
    for row in sorted(rows, key=lambda r: r.config.replicas):
        base = by_key.get(replace(row.config, replicas=1).key)
        if row.config.replicas == 1 or base is None or base.max_rate <= 0 or row.max_rate <= 0:
            continue
        ratio = row.max_rate / (base.max_rate * row.config.replicas)
        if ratio > 1 + tol:
            family = [k for k in swept if k != "replicas"]
            found.setdefault(base.config.label(family) if family else "", []).append(
                f"{row.config.replicas} replicas {ratio:.2f}x")
    if not found:
        return []
    listed = "; ".join(f"{label}: {', '.join(v)}" if label else ", ".join(v) for label, v in found.items())
    return [f"more than linear in replicas (max rate per replica against one replica's) — {listed}: the router "
            "splits the workload's clusters of close arrivals over the replicas, where one replica queues each "
            "whole (smooth, Poisson arrivals scale linearly)"]


def _interval(iv: dict[str, Any] | None) -> str:
    if not iv:
        return ""
    return (f"  max rate median {iv['median']:.3f} [p5-p95 {iv['p5']:.3f}-{iv['p95']:.3f}] "
            f"over {len(iv['samples'])} sampled runs")


def rejection_lines(rows: list[PlanRow], labels: list[str]) -> list[str]:
    """Requests the configurations refused at admission, by reason: once when every configuration
    refused the same ones, else per configuration."""
    from traces.summary import format_rejections

    found = [(label, r.rejected) for r, label in zip(rows, labels)]
    if not any(counts for _, counts in found):
        return []
    if all(counts == found[0][1] for _, counts in found):
        return [f"every configuration: {line}" for line in format_rejections(found[0][1])]
    return [f"{label}: {line}" for label, counts in found for line in format_rejections(counts)]


def recommend(rows: list[PlanRow], offered_rate: float, swept: list[str]) -> str:
    """One line: the cheapest configuration (per hour) that meets every SLO at the workload's own rate, or
    with no prices the one with the highest max rate per replica among those that meet it."""
    meeting = [r for r in rows if r.max_rate >= offered_rate and r.max_rate > 0]
    if not meeting:
        best = max(rows, key=lambda r: r.max_rate, default=None)
        tail = "" if best is None else (f"; the highest max rate is {best.max_rate:.3f} req/s "
                                         f"({best.config.label(swept)})")
        return f"recommendation: none meets every SLO at the offered {offered_rate:.3f} req/s{tail}"
    if any(r.usd_per_hour is not None for r in meeting):
        pick = min((r for r in meeting if r.usd_per_hour is not None),
                   key=lambda r: (r.usd_per_hour, -r.max_rate))
        why = f"cheapest that meets every SLO at the offered {offered_rate:.3f} req/s (${pick.usd_per_hour:.2f}/h)"
    else:
        pick = max(meeting, key=lambda r: (r.max_rate / r.config.replicas, -r.config.replicas))
        why = f"highest max rate per replica among those meeting every SLO at the offered {offered_rate:.3f} req/s"
    headroom = pick.max_rate / offered_rate
    return f"recommendation: {pick.config.label(swept)} — {why}; headroom {headroom:.1f}x"
