"""What each panel says, as rich Text and table rows built from a RunIndex; no widgets here, so the
wording can be read and tested without a terminal."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.text import Text

from traces.summary import format_summary
from tui import reasons
from tui.compare import Comparison
from traces.describe import config_differences
from traces.frames import list_cell
from tui.model import RunIndex, as_float, as_int
from tui.queues import admissions
from tui.widgets.vtable import Cell, Column

RowFn = Callable[[int], list[Cell]]

SHOWN_META = ("format_version", "source", "complete")
EVENT_STYLE = {"preempt": "bold red", "finish": "green", "abort": "yellow", "reject": "yellow"}
SCHEDULED_COLUMNS = [Column("request", 12), Column("phase", 8), Column("tokens", 6, True),
                     Column("computed/total", 15, True), Column("hit", 5, True), Column("+blocks", 18),
                     Column("-blocks", 18)]
RUNNING_COLUMNS = [Column("#", 4, True), Column("request", 12), Column("prompt", 6, True),
                   Column("since", 7, True)]
WAITING_COLUMNS = [Column("#", 4, True), Column("request", 12), Column("queued at s", 11, True),
                   Column("why not admitted", 50, flex=True)]
LIFECYCLE_COLUMNS = [Column("time s", 9, True), Column("step", 7, True), Column("event", 11),
                     Column("detail", 60, flex=True)]
COMPARE_COLUMNS = [Column("", 1), Column("step", 7, True), Column("A tok", 6, True), Column("B tok", 6, True),
                   Column("A run/wait", 10, True), Column("B run/wait", 10, True), Column("A KV", 6, True),
                   Column("B KV", 6, True), Column("A ms", 8, True), Column("B ms", 8, True)]


def ms(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds * 1e3:.1f} ms"


def block_list(ids: Any) -> str:
    ids = list(list_cell(ids))
    return f"{len(ids)} [{' '.join(map(str, ids))}]" if ids else ""


def title(run: RunIndex, pos: int, selected: str | None, runs: int) -> Text:
    model = (run.meta.get("config") or {}).get("model") or {}
    device = run.meta.get("device") or {}
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {run.name} ", "bold reverse")
    t.append(f" {model.get('architecture') or model.get('model') or '?'} · {device.get('type', '?')} ")
    if pos < run.n:
        t.append(f"│ step {int(run.step_no[pos])} ({pos + 1}/{run.n}) ", "bold")
    else:
        t.append(f"│ step {pos}: past the end of this run ({run.n} steps) ", "bold yellow")
    t.append(f"│ selected {selected or '-'} ", "magenta")
    if runs > 1:
        t.append("│ b: show the other run ", "dim")
    t.append("│ ? help", "dim")
    return t


def step_summary(run: RunIndex, pos: int) -> Text:
    """Three lines: times, token/KV/queue counters, and who was preempted, admitted and finished; a
    fourth with the routing counters in a MoE model's trace."""
    r = run.step_row(pos)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"Step {int(r['step'])}", "bold")
    t.append(f"  t {r['start']:.4f}-{r['end']:.4f} s  {ms(r['end'] - r['start'])}: schedule "
             f"{ms(as_float(r.get('schedule_time')))}, execute {ms(as_float(r.get('execute_time')))}, "
             f"sample {ms(as_float(r.get('sample_time')))}\n")
    total = max(int(r["kv_blocks_total"]), 1)
    t.append(f"tokens {int(r['num_scheduled_tokens'])} (prefill {int(r['num_prefill_tokens'])}, decode "
             f"{int(r['num_decode_tokens'])}) · prefix hits {int(r['prefix_hit_tokens'])} · KV "
             f"{int(r['kv_blocks_used'])}/{total} blocks ({100 * r['kv_blocks_used'] / total:.1f}%) · running "
             f"{int(r['num_running'])} · waiting {int(r['num_waiting'])}\n")
    dec = run.decisions_at(pos)
    ev = dec["event"].to_numpy()
    admitted = dec[admissions(dec)]["request_id"]
    parts = [("preempted", dec[ev == "preempt"]["request_id"], "bold red"),
             ("admitted", admitted, "cyan"),
             ("finished", dec[np.isin(ev, ("finish", "abort", "reject"))]["request_id"], "green")]
    for k, (label, ids, style) in enumerate(parts):
        t.append(("" if not k else " · ") + f"{label}: ")
        t.append(", ".join(map(str, ids)) or "-", style if len(ids) else "dim")
    if run.has_moe:
        t.append("\n" + moe_routing(r))
    return t


def moe_routing(r: dict[str, Any]) -> str:
    """A step's MoE counters in words (traces.schema MOE_COLUMNS)."""
    most = as_float(r.get("moe_experts_active_max"))
    if most != most:
        return "MoE routing: not counted in this step"
    return (f"MoE routing: {as_float(r.get('moe_experts_active_mean')):.1f} experts active per layer (most "
            f"{int(most)}) · busiest expert {as_int(r.get('moe_expert_tokens_max'))} of "
            f"{int(r['num_scheduled_tokens'])} tokens")


def scheduled_rows(run: RunIndex, pos: int, selected: str | None) -> tuple[list[list[Cell]], list[str], list[str]]:
    """Rows of the step's decisions (scheduled requests first, then events), their styles and ids."""
    rows, styles, ids = [], [], []
    dec = run.decisions_at(pos)
    order = np.argsort(dec["event"].to_numpy() != "schedule", kind="stable")
    dec = dec.iloc[order]
    totals = run.total_tokens(dec["request_id"])
    for r, total in zip(dec.itertuples(index=False), totals):
        rid = str(r.request_id)
        name: Cell = (rid, "bold magenta") if rid == selected else rid
        if r.event == "schedule":
            done = as_int(r.num_computed_tokens)
            rows.append([name, str(r.phase), str(int(r.num_tokens)),
                         f"{done}+{int(r.num_tokens)}/{'?' if total < 0 else int(total)}",
                         str(int(r.prefix_hit_tokens)) if r.prefix_hit_tokens else "", block_list(r.blocks_gained),
                         ""])
            styles.append("")
        else:
            why = r.finish_reason if isinstance(r.finish_reason, str) else ""
            shortfall = ""
            if isinstance(getattr(r, "preempted_for", None), str):  # whom the preemption made room for
                why = "for itself" if r.preempted_for == rid else f"for {r.preempted_for}"
                shortfall = f"needed {as_int(r.blocks_needed)}, {as_int(r.blocks_free)} free"
            rows.append([name, str(r.event).upper(), "", why, "", shortfall, block_list(r.blocks_freed)])
            styles.append(EVENT_STYLE.get(str(r.event), ""))
        ids.append(rid)
    return rows, styles, ids


def running_rows(run: RunIndex, pos: int, selected: str | None) -> tuple[int, RowFn, list[str]]:
    """The running queue after the step: (row count, row builder, request ids)."""
    codes, since = run.queues.running_since(int(run.step_no[pos]))
    ids = run.queues.ids[codes]
    prompt = run.req_prompt

    def row(i: int) -> list[Cell]:
        rid = str(ids[i])
        return [str(i + 1), (rid, "bold magenta") if rid == selected else rid, str(prompt[codes[i]]), str(since[i])]
    return len(codes), row, list(map(str, ids))


def waiting_rows(run: RunIndex, pos: int, selected: str | None) -> tuple[int, RowFn, list[str]]:
    """The waiting queue after the step, front first, each with why the step did not admit it."""
    q = run.queues
    codes, pre = q.waiting_detail(int(run.step_no[pos]), float(run.start[pos]))
    ids = q.ids[codes]
    stop, preempted = reasons.admission_stop(run, pos), reasons.preemptions(run, pos)
    id_list = list(map(str, ids))
    # Ahead of the blocked request only an async request whose stale output was still due can wait.
    front = id_list.index(stop.request_id) if stop is not None and stop.request_id in id_list else 0

    def row(i: int) -> list[Cell]:
        rid = str(ids[i])
        why = reasons.wait_text(stop, preempted, rid) if i >= front or rid in preempted else ""
        note: Cell = (why or "preempted", "red") if pre[i] else why  # red: back in the queue after a preemption
        return [str(i + 1), (rid, "bold magenta") if rid == selected else rid, f"{q.queued[codes[i]]:.3f}", note]
    return len(codes), row, id_list


def request_info(run: RunIndex, rid: str | None) -> Text:
    t = Text(no_wrap=False)
    info = run.request(rid) if rid else None
    if rid is None or info is None:
        return t.append("No request selected: pick one in a table (or press s).", "dim")
    lat = run.latencies(rid)
    t.append(f"{rid}", "bold magenta")
    count = {k: as_int(info.get(k)) for k in ("num_prompt_tokens", "num_output_tokens", "num_preemptions")}
    t.append(f"  prompt {count['num_prompt_tokens']} · output {count['num_output_tokens']} (max "
             f"{info.get('max_tokens')}) · from the prefix cache {run.prefix_hits(rid)} (all admissions) · preemptions "
             f"{count['num_preemptions']} · priority {info.get('priority')} · "
             f"finish {info.get('finish_reason') or 'not finished'}\n")
    t.append(f"arrival {as_float(info['arrival']):.4f} s · queue {ms(lat['queue'])} · TTFT {ms(lat['ttft'])} · "
             f"TPOT {ms(lat['tpot'])} · E2E {ms(lat['e2e'])}")
    if isinstance(info.get("error"), str):
        t.append(f"\nrejected: {info['error']}", "yellow")
    return t


def _section(t: Text, name: str, value: Any) -> None:
    t.append(f"{name}\n", "bold underline")
    if isinstance(value, dict):
        for k, v in value.items():
            shown = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
            t.append(f"  {k}: ", "bold")
            t.append(f"{shown[:200]}\n")
    else:
        t.append(f"  {value}\n")


def run_info(run: RunIndex) -> Text:
    """Model, config, device, workload, cost model and the headline metrics of one run."""
    meta, t = run.meta, Text()
    t.append(f"{run.name}  ({run.trace.path})\n", "bold reverse")
    t.append(f"source {run.source} · format v{meta.get('format_version')} · "
             f"{'complete' if meta.get('complete') else 'incomplete (read up to its last step)'} · "
             f"{run.n} steps · {len(run.requests)} requests\n\n")
    t.append("headline metrics\n", "bold underline")
    t.append(format_summary(run.summary) + "\n\n")
    config = meta.get("config") or {}
    scalars = {k: v for k, v in meta.items() if not isinstance(v, (dict, list)) and k not in SHOWN_META}
    model = {k: v for k, v in (config.get("model") or {}).items() if k != "hf_config"}
    for name, value in (("model", model), ("scheduler", config.get("scheduler")), ("cache", config.get("cache")),
                        ("KV cache", meta.get("kv_cache")), ("device", meta.get("device") or config.get("device")),
                        ("workload", meta.get("workload")), ("cost model", meta.get("cost_model")),
                        ("run", scalars), ("versions", meta.get("versions"))):
        if value:
            _section(t, name, value)
    return t


def compare_row(cmp: Comparison, i: int) -> list[Cell]:
    a, b = cmp.a, cmp.b

    def pick(run: RunIndex, fmt: Any) -> str:
        return fmt(run, i) if i < run.n else "-"
    mark: Cell = ("◆", "bold red") if cmp.is_divergent[i] else ""
    return [mark, str(int(a.step_no[i] if i < a.n else b.step_no[i])),
            pick(a, lambda r, k: str(r.tokens[k])), pick(b, lambda r, k: str(r.tokens[k])),
            pick(a, lambda r, k: f"{r.num_running[k]}/{r.num_waiting[k]}"),
            pick(b, lambda r, k: f"{r.num_running[k]}/{r.num_waiting[k]}"),
            pick(a, lambda r, k: str(r.kv_used[k])), pick(b, lambda r, k: str(r.kv_used[k])),
            pick(a, lambda r, k: f"{r.duration[k] * 1e3:.2f}"), pick(b, lambda r, k: f"{r.duration[k] * 1e3:.2f}")]


def compare_head(cmp: Comparison) -> Text:
    t = Text()
    t.append(f"A {cmp.a.source} {cmp.a.trace.path.name} ({cmp.a.n} steps) vs "
             f"B {cmp.b.source} {cmp.b.trace.path.name} ({cmp.b.n}) · ")
    first = cmp.first_divergence
    if first is None:
        t.append("no divergence: every step decided the same", "green")
    else:
        t.append(f"{len(cmp.divergent)} divergent steps, first: {first} (f first, d/D next/prev)", "bold red")
    for key, what, pos in (("c", "clocks parted at", cmp.clocks_parted), ("k", "KV pools differ after", cmp.pools_parted)):
        if pos is not None:
            t.append(f" · {what} step {int(cmp.a.step_no[pos])} ({key})", "bold")
    differences = config_differences(cmp.a.meta, cmp.b.meta)
    if differences:
        t.append(f" · configured differently: {', '.join(differences)}", "bold yellow")
    return t


def explanation(cmp: Comparison, pos: int) -> Text:
    t = Text()
    for k, line in enumerate(cmp.explain(pos)):
        t.append(line + "\n", "bold" if k == 0 else "")
    return t
