"""Why a waiting request was not admitted in a step, and whom a preemption served, in words.

The scheduler records only where it stopped (steps: `admission_blocked*`, decisions: `preempted_for`,
`blocks_needed`, `blocks_free`; see traces/FORMAT.md). Budget, seats and a preempting step hold back the
whole queue; a KV or prompt-size stop holds back its request, and everyone behind it waits in queue order
(vLLM's FCFS and priority queues never skip ahead). Not explained: a request that async scheduling skips
while its pre-preemption output is still due (the step view leaves it blank; a lifecycle calls it behind).
Traces from before these columns explain nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tui.model import LifecycleEvent, RunIndex, as_float, as_int

QUEUE_WIDE = ("token_budget", "max_num_seqs", "preempted")


@dataclass(slots=True)
class AdmissionStop:
    reason: str
    request_id: str
    needed: int
    available: int
    # full_sequence: the (prompt, output) tokens the request had when the step began, which is what must fit
    sequence: tuple[int, int] | None = None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def stop_text(stop: AdmissionStop) -> str:
    """The stop itself, as said of the request it stopped at."""
    n, m = stop.needed, stop.available
    return {
        "token_budget": "token budget spent",
        "max_num_seqs": "max_num_seqs reached: no free seat",
        "kv_short": f"KV short: needs {_plural(n, 'block')}, {m} free",
        "full_sequence": _full_sequence_text(stop),
        "no_chunk": f"prompt {n} tokens > {m} left (no chunked prefill)",
        "preempted": "no admissions: the step preempted",
    }.get(stop.reason, f"admissions stopped ({stop.reason})")


def _full_sequence_text(stop: AdmissionStop) -> str:
    """vLLM's full-sequence admission counts the tokens the request has now (prompt plus what it generated
    before a preemption), not prompt + max_tokens, in blocks its prefix-cache hits do not already hold."""
    need = f"need {_plural(stop.needed, 'block')} beyond cached ones, {stop.available} free"
    if stop.sequence is None:
        return f"sequence so far must fit: its prompt + output so far {need}"
    prompt, output = stop.sequence
    return f"sequence so far must fit: its {prompt + output} tokens (prompt {prompt} + {output} output) {need}"


def sequence_so_far(run: RunIndex, rid: str, pos: int) -> tuple[int, int] | None:
    """(prompt, output) tokens `rid` had when step `pos` began. A step that carries a request to the end
    of its tokens samples one more, so the output so far is one past the furthest any earlier step
    reached beyond the prompt."""
    info = run.request(rid)
    if info is None:
        return None
    prompt = as_int(info.get("num_prompt_tokens"))
    rows = run.decisions.iloc[run.request_rows(rid)]
    rows = rows[(rows["step"].to_numpy() < run.step_no[pos]) & (rows["event"] == "schedule").to_numpy()]
    reached = (rows["num_computed_tokens"].fillna(0).to_numpy(np.int64) + rows["num_tokens"].fillna(0).to_numpy(np.int64))
    return prompt, int(max(reached.max(initial=0) + 1 - prompt, 0))


def preempt_text(rid: str, forced_by: str, needed: int, free: int) -> str:
    if forced_by == rid:  # the last running request could not grow and had nobody left to preempt
        return f"preempted itself (needed {_plural(needed, 'block')}, {free} free)"
    return f"preempted for {forced_by} (needed {_plural(needed, 'block')}, {free} free)"


def admission_stop(run: RunIndex, pos: int) -> AdmissionStop | None:
    """The step's recorded stop, None when nobody was left waiting or the trace predates the columns."""
    steps = run.steps
    if "admission_blocked" not in steps.columns or pos >= run.n:
        return None
    reason = steps["admission_blocked"].iat[pos]
    if not isinstance(reason, str):
        return None
    return _stop(run, pos, reason, str(steps["admission_blocked_request"].iat[pos]),
                 as_int(steps["admission_needed"].iat[pos]), as_int(steps["admission_available"].iat[pos]))


def _stop(run: RunIndex, pos: int, reason: str, rid: str, needed: int, available: int) -> AdmissionStop:
    sequence = sequence_so_far(run, rid, pos) if reason == "full_sequence" else None
    return AdmissionStop(reason, rid, needed, available, sequence)


def preemptions(run: RunIndex, pos: int) -> dict[str, str]:
    """Request id -> why it was preempted in this step (empty for traces without `preempted_for`)."""
    if pos >= run.n or not run.num_preempted[pos] or "preempted_for" not in run.decisions.columns:
        return {}
    dec = run.decisions_at(pos)
    rows = dec[(dec["event"] == "preempt").to_numpy() & dec["preempted_for"].notna().to_numpy()]
    return {str(r.request_id): preempt_text(str(r.request_id), str(r.preempted_for), as_int(r.blocks_needed),
                                            as_int(r.blocks_free))
            for r in rows.itertuples(index=False)}


def wait_text(stop: AdmissionStop | None, preempted: dict[str, str], rid: str) -> str:
    """Why `rid`, waiting after the step, was not admitted in it ('' when the trace does not say)."""
    if rid in preempted:
        return preempted[rid]
    if stop is None:
        return ""
    if stop.reason in QUEUE_WIDE or stop.request_id == rid:
        return stop_text(stop)
    return f"waits behind {stop.request_id} (queue order)"


def waits(run: RunIndex, rid: str) -> list[LifecycleEvent]:
    """One lifecycle line per run of consecutive steps `rid` waited in for the same reason (a step that
    preempted it is told by its preempt line)."""
    q, steps = run.queues, run.steps
    if not run.has_request(rid) or "admission_blocked" not in steps.columns:
        return []
    code = run.req_pos.get_loc(rid)
    waiting = (run.start >= q.queued[code]) & (run.step_no < q.req_end[code])
    mine = q.iv_code == code
    for a, b in zip(q.iv_start[mine], q.iv_end[mine]):
        waiting &= ~((run.step_no >= a) & (run.step_no < b))
    rows = run.decisions.iloc[run.request_rows(rid)]
    waiting &= ~np.isin(run.step_no, rows["step"][rows["event"] == "preempt"].to_numpy())
    reason = steps["admission_blocked"].to_numpy(dtype=object)
    blocked = steps["admission_blocked_request"].to_numpy(dtype=object)
    needed = steps["admission_needed"].to_numpy(dtype=object)
    available = steps["admission_available"].to_numpy(dtype=object)
    texts = []
    for pos in np.flatnonzero(waiting).tolist():
        stop = None
        if isinstance(reason[pos], str):  # only its own stop is told in its numbers
            stop = (_stop(run, pos, reason[pos], rid, as_int(needed[pos]), as_int(available[pos]))
                    if blocked[pos] == rid else AdmissionStop(reason[pos], str(blocked[pos]), 0, 0))
        texts.append((pos, wait_text(stop, {}, rid)))
    out: list[LifecycleEvent] = []
    k = 0
    while k < len(texts):
        first, text = texts[k]
        j = k
        while j + 1 < len(texts) and texts[j + 1] == (texts[j][0] + 1, text):
            j += 1
        last = texts[j][0]
        if text:
            span = (f"step {int(run.step_no[first])}" if first == last
                    else f"steps {int(run.step_no[first])}-{int(run.step_no[last])}")
            out.append(LifecycleEvent(as_float(run.start[first]), int(run.step_no[first]), "waited",
                                      f"{span}: {text}"))
        k = j + 1
    return out


def explained_lifecycle(run: RunIndex, rid: str) -> list[LifecycleEvent]:
    """The request's lifecycle with its waits between the events, in time order."""
    out = run.lifecycle(rid) + waits(run, rid)
    out.sort(key=lambda e: (e.time, e.kind in ("first token", "finished")))
    return out
