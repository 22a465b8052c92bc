"""Two runs side by side (typically an engine trace and its simulator replay), aligned by step number.
A step *diverges* as `sim compare` counts it (traces.diff): different decision rows, or the step exists
in one run only. Step times never count as divergence; they are expected to differ between a real engine
and a cost model."""
from __future__ import annotations

import numpy as np

from traces.diff import explain_step, matching_steps, normalized_decisions
from tui.model import RunIndex, as_float

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

    @property
    def first_divergence(self) -> int | None:
        return int(self.divergent[0]) if len(self.divergent) else None

    def next_divergence(self, pos: int, direction: int = 1) -> int | None:
        return self.a.next_in(self.divergent, pos, direction) if self.n else None

    def explain(self, pos: int) -> list[str]:
        """Plain sentences on what differs at step position `pos` (decisions, queues, counters, times)."""
        a, b = self.a, self.b
        if pos >= a.n or pos >= b.n:
            only = "A" if pos < a.n else "B"
            return [f"step {pos} exists only in run {only}: run {'B' if only == 'A' else 'A'} ended after "
                    f"{min(a.n, b.n)} steps"]
        step = int(a.step_no[pos])
        lines = [f"step {step}: " + ("decisions differ" if self.is_divergent[pos] else "same decisions in A and B")]
        lines += self._decision_diffs(pos)
        if self.is_divergent[pos]:
            lines += self._queue_diffs(pos)
        for name, col in (("tokens scheduled", "tokens"), ("running", "num_running"), ("waiting", "num_waiting"),
                          ("preempted", "num_preempted"), ("KV blocks used", "kv_used")):
            va, vb = int(getattr(a, col)[pos]), int(getattr(b, col)[pos])
            if va != vb:
                lines.append(f"{name}: A {va}, B {vb}")
        da, db = a.duration[pos] * 1e3, b.duration[pos] * 1e3
        lines.append(f"step time: A {da:.2f} ms, B {db:.2f} ms ({db - da:+.2f} ms); "
                     f"start A {a.start[pos]:.4f} s, B {b.start[pos]:.4f} s")
        return lines

    def _decision_diffs(self, pos: int) -> list[str]:
        rows_a, rows_b = self.a.decisions_at(pos), self.b.decisions_at(pos)
        return [f"{d.request_id}: " + "; ".join(d.differences)
                for d in explain_step(normalized_decisions(rows_a), normalized_decisions(rows_b))]

    def _queue_diffs(self, pos: int) -> list[str]:
        """Requests that had arrived in one run but not the other when the step started: the usual cause."""
        out = []
        a, b = self.a, self.b
        before = int(a.step_no[pos]) - 1
        qa, qb = a.queues, b.queues
        wa = set(qa.ids[qa.waiting_at(before, a.start[pos])])
        wb = set(qb.ids[qb.waiting_at(before, b.start[pos])])
        for rid in sorted(wa ^ wb):
            inside, other, run = ("A", "B", b) if rid in wa else ("B", "A", a)
            queued = as_float((run.request(rid) or {}).get("queued"))
            if queued > run.start[pos]:
                why = (f"in {other} it was queued only at {queued:.4f} s, after the step started "
                       f"({run.start[pos]:.4f} s)")
            else:
                why = f"in {other} it was already running or done"
            out.append(f"{rid} was waiting in {inside} but not in {other} when the step started: {why}")
        return out
