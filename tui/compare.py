"""Two runs side by side (typically an engine trace and its simulator replay), aligned by step number.
A step *diverges* as `sim compare` counts it (traces.diff): different decision rows, or the step exists
in one run only. Step times never count as divergence; they are expected to differ between a real engine
and a cost model.

At a divergent step, `divergence_causes` says why the runs decided differently there, from what each
carried into the step: a request that had arrived in one run only (its clock ran ahead or behind), a
different running set, a different number of free KV blocks, different output lengths, and the stops and
preemptions each scheduler recorded in the step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.diff import explain_step, matching_steps, normalized_decisions
from tui import reasons
from tui.model import RunIndex, as_float, as_int

# Two clocks have parted once a step starts or ends more than this apart in A and B.
CLOCK_TOLERANCE_S = 1e-3


@dataclass(slots=True)
class Cause:
    """One reason two runs decided differently at a step: its kind (arrival, running, kv, output,
    admission, preemption) and the sentence that tells it."""

    kind: str
    text: str


def _names(ids: list[str]) -> str:
    """A few request ids in words, the rest counted."""
    if len(ids) <= 4:
        return ", ".join(ids[:-1]) + (" and " if len(ids) > 1 else "") + ids[-1]
    return f"{', '.join(ids[:3])} and {len(ids) - 3} more"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def clocks_parted(a: RunIndex, b: RunIndex, tolerance_s: float = CLOCK_TOLERANCE_S) -> int | None:
    """The first step position where A's and B's steps start or end more than `tolerance_s` apart."""
    m = min(a.n, b.n)
    apart = (np.abs(a.start[:m] - b.start[:m]) > tolerance_s) | (np.abs(a.end[:m] - b.end[:m]) > tolerance_s)
    hit = np.flatnonzero(apart)
    return int(hit[0]) if len(hit) else None


def pools_parted(a: RunIndex, b: RunIndex) -> int | None:
    """The first step position after which A's and B's KV pools hold a different number of used or free
    blocks."""
    m = min(a.n, b.n)
    hit = np.flatnonzero((a.kv_used[:m] != b.kv_used[:m]) | (a.kv_total[:m] != b.kv_total[:m]))
    return int(hit[0]) if len(hit) else None


def _free_before(run: RunIndex, pos: int) -> int:
    """Free KV blocks when step `pos` began: what the step before left (all of them before the first)."""
    return int(run.kv_total[max(pos - 1, 0)] - (run.kv_used[pos - 1] if pos else 0))


def _arrivals(a: RunIndex, b: RunIndex, pos: int) -> list[Cause]:
    """Requests waiting at the step's start in one run that had not yet arrived in the other: because the
    other's clock ran ahead (then how the two clocks came apart), or because they arrived later there."""
    out = []
    start = {"A": float(a.start[pos]), "B": float(b.start[pos])}
    step = int(a.step_no[pos])
    clock = False
    for here, there, run_here, run_there in (("A", "B", a, b), ("B", "A", b, a)):
        before_here, before_there = int(run_here.step_no[pos]) - 1, int(run_there.step_no[pos]) - 1
        waiting = set(run_here.queues.ids[run_here.queues.waiting_at(before_here, start[here])])
        waiting -= set(run_there.queues.ids[run_there.queues.waiting_at(before_there, start[there])])
        late: list[tuple[float, str]] = []
        later: list[tuple[float, str]] = []
        for rid in sorted(map(str, waiting)):
            if not run_there.has_request(rid):
                continue
            t_here = float(run_here.queues.queued[run_here.req_pos.get_loc(rid)])
            t_there = float(run_there.queues.queued[run_there.req_pos.get_loc(rid)])
            if t_there > start[there]:  # not there yet; and not even by the time this run's step began:
                (later if t_there > start[here] else late).append((t_there, rid))
        if late:
            late.sort()
            clock = True
            ids = [r for _, r in late]
            when = (f"it reached {there}'s scheduler at {late[0][0]:.4f} s" if len(late) == 1
                    else f"they reached {there}'s scheduler at {late[0][0]:.4f}-{late[-1][0]:.4f} s")
            out.append(Cause("arrival", f"{_names(ids)} had not yet arrived in {there} ({when}): {there}'s clock "
                                        f"ran {_ms(start[here] - start[there])} ahead of {here}'s (step {step} "
                                        f"started at {start[there]:.4f} s in {there}, {start[here]:.4f} s in {here})"))
        for t_there, rid in sorted(later):
            t_here = float(run_here.queues.queued[run_here.req_pos.get_loc(rid)])
            out.append(Cause("arrival", f"{rid} arrived later in {there} than in {here}: it reached {there}'s "
                                        f"scheduler at {t_there:.4f} s, after {there}'s step {step} began "
                                        f"({start[there]:.4f} s); {here}'s at {t_here:.4f} s, in time for {here}'s "
                                        f"({start[here]:.4f} s)"))
    if clock and pos:
        out.append(Cause("clock", _clock_history(a, b, pos)))
    return out


def _clock_history(a: RunIndex, b: RunIndex, pos: int) -> str:
    """Where the two clocks came apart before step `pos`: the step whose cycle (start to the next start)
    differed most, and the first step past the tolerance."""
    cycle_a, cycle_b = np.diff(a.start[:pos + 1]), np.diff(b.start[:pos + 1])
    worst = int(np.argmax(np.abs(cycle_a - cycle_b)))
    text = (f"the clocks parted most at step {int(a.step_no[worst])} (start to next start: A "
            f"{_ms(cycle_a[worst])}, B {_ms(cycle_b[worst])})")
    first = clocks_parted(a, b)
    if first is not None and first < pos:
        text += (f", and first by more than {_ms(CLOCK_TOLERANCE_S)} at step {int(a.step_no[first])} "
                 "(c jumps there)")
    return text


def _running(a: RunIndex, b: RunIndex, pos: int) -> list[Cause]:
    """A different running set carried into the step."""
    if not pos:
        return []
    ra = set(a.queues.ids[a.queues.running_at(int(a.step_no[pos - 1]))])
    rb = set(b.queues.ids[b.queues.running_at(int(b.step_no[pos - 1]))])
    if ra == rb:
        return []
    parts = [f"{_names(sorted(only))} in {name} only" for name, only in (("A", ra - rb), ("B", rb - ra)) if only]
    return [Cause("running", f"running when the step began: {'; '.join(parts)} ({len(ra)} in A, {len(rb)} in B)")]


def _kv(a: RunIndex, b: RunIndex, pos: int) -> list[Cause]:
    fa, fb = _free_before(a, pos), _free_before(b, pos)
    if fa == fb:
        return []
    first = pools_parted(a, b)
    where = f"; the pools first differed after step {int(a.step_no[first])} (k jumps there)" if first is not None else ""
    return [Cause("kv", f"free KV blocks when the step began: A {fa}, B {fb}{where}")]


def _outputs(a: RunIndex, b: RunIndex, rids: list[str]) -> list[Cause]:
    """Requests of the step that finished after a different number of output tokens in the two runs."""
    out = []
    for rid in rids:
        ia, ib = a.request(rid) or {}, b.request(rid) or {}
        na, nb = as_int(ia.get("num_output_tokens")), as_int(ib.get("num_output_tokens"))
        if ia and ib and na != nb and ia.get("finish_reason") and ib.get("finish_reason"):
            out.append(Cause("output", f"{rid} produced {na} output tokens in A ({ia.get('finish_reason')}), {nb} "
                                       f"in B ({ib.get('finish_reason')})"))
    return out


def _stops(a: RunIndex, b: RunIndex, pos: int) -> list[Cause]:
    """What each scheduler recorded in the step: where it stopped admitting, and whom it preempted why."""
    out = []
    sa, sb = reasons.admission_stop(a, pos), reasons.admission_stop(b, pos)
    ta, tb = ((f"at {s.request_id}: {reasons.stop_text(s)}" if s else "nobody left waiting") for s in (sa, sb))
    if ta != tb:
        out.append(Cause("admission", f"admissions stopped in A {ta}; in B {tb}"))
    pa, pb = reasons.preemptions(a, pos), reasons.preemptions(b, pos)
    if pa != pb:
        told = [f"{name}: " + ("; ".join(f"{rid} {why}" for rid, why in p.items()) or "no preemption")
                for name, p in (("A", pa), ("B", pb))]
        out.append(Cause("preemption", " · ".join(told)))
    return out


def divergence_causes(a: RunIndex, b: RunIndex, pos: int) -> list[Cause]:
    """Why A and B decided differently at step position `pos` (both runs have it), most telling first:
    arrivals that one clock had passed and the other had not, then the running set and free KV blocks
    each carried into the step, output lengths of the step's requests, and the stops and preemptions the
    schedulers recorded in it. Empty when none of these differs."""
    rids = sorted(set(a.decisions_at(pos)["request_id"].astype(str)) | set(b.decisions_at(pos)["request_id"].astype(str)))
    return _arrivals(a, b, pos) + _running(a, b, pos) + _kv(a, b, pos) + _outputs(a, b, rids) + _stops(a, b, pos)


class Comparison:
    """Aligned steps of runs A and B, the steps where they diverge, and why."""

    def __init__(self, a: RunIndex, b: RunIndex) -> None:
        self.a, self.b = a, b
        self.n = max(a.n, b.n)
        m = min(a.n, b.n)
        steps = lambda run: int(run.step_no.max()) + 1 if run.n else 0  # noqa: E731
        same, _, _ = matching_steps(a.decisions, steps(a), b.decisions, steps(b))
        sa, sb = a.step_no[:m], b.step_no[:m]
        differs = (sa != sb) | ~same[np.minimum(sa, len(same) - 1)] if m else np.zeros(0, bool)
        self.divergent = np.r_[np.flatnonzero(differs), np.arange(m, self.n)].astype(np.int64)
        self.is_divergent = np.zeros(self.n, bool)
        self.is_divergent[self.divergent] = True
        self.clocks_parted = clocks_parted(a, b)
        self.pools_parted = pools_parted(a, b)

    @property
    def first_divergence(self) -> int | None:
        return int(self.divergent[0]) if len(self.divergent) else None

    def next_divergence(self, pos: int, direction: int = 1) -> int | None:
        return self.a.next_in(self.divergent, pos, direction) if self.n else None

    def explain(self, pos: int) -> list[str]:
        """Plain sentences on what differs at step position `pos`: the decisions, why (when they differ),
        the counters and the times."""
        a, b = self.a, self.b
        if pos >= a.n or pos >= b.n:
            only = "A" if pos < a.n else "B"
            return [f"step {pos} exists only in run {only}: run {'B' if only == 'A' else 'A'} ended after "
                    f"{min(a.n, b.n)} steps"]
        step = int(a.step_no[pos])
        lines = [f"step {step}: " + ("decisions differ" if self.is_divergent[pos] else "same decisions in A and B")]
        lines += self._decision_diffs(pos)
        if self.is_divergent[pos]:
            causes = divergence_causes(a, b, pos)
            lines += [f"why: {c.text}" for c in causes] or [
                "why: nothing carried into the step differs (arrivals, running set, free KV blocks, output "
                "lengths); the schedulers decided differently within it"]
        for name, col in (("tokens scheduled", "tokens"), ("running", "num_running"), ("waiting", "num_waiting"),
                          ("preempted", "num_preempted"), ("KV blocks used", "kv_used")):
            va, vb = int(getattr(a, col)[pos]), int(getattr(b, col)[pos])
            if va != vb:
                lines.append(f"{name}: A {va}, B {vb}")
        if pos == self.clocks_parted:
            apart = float(b.end[pos] - a.end[pos])
            lines.append(f"the clocks first part by more than {_ms(CLOCK_TOLERANCE_S)} here: the step ends at "
                         f"{a.end[pos]:.4f} s in A, {b.end[pos]:.4f} s in B ({_ms(abs(apart))} "
                         f"{'sooner' if apart < 0 else 'later'} in B)")
        if pos == self.pools_parted:
            lines.append("the KV pools first differ after this step")
        da, db = a.duration[pos] * 1e3, b.duration[pos] * 1e3
        lines.append(f"step time: A {da:.2f} ms, B {db:.2f} ms ({db - da:+.2f} ms); "
                     f"start A {as_float(a.start[pos]):.4f} s, B {as_float(b.start[pos]):.4f} s")
        return lines

    def _decision_diffs(self, pos: int) -> list[str]:
        rows_a, rows_b = self.a.decisions_at(pos), self.b.decisions_at(pos)
        return [f"{d.request_id}: " + "; ".join(d.differences)
                for d in explain_step(normalized_decisions(rows_a), normalized_decisions(rows_b))]
