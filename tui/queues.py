"""The scheduler's running and waiting queues after any step, derived from a trace (which records
decisions, not queues) by `QueueIndex`; the derived lengths equal the steps table's `num_running` /
`num_waiting` (checked by the tests)."""
from __future__ import annotations

import numpy as np
import pandas as pd

INF = np.iinfo(np.int64).max


def admissions(decisions: pd.DataFrame) -> np.ndarray:
    """Rows where a request enters the running queue: schedule rows starting from their prefix hits."""
    computed = pd.to_numeric(decisions["num_computed_tokens"], errors="coerce").to_numpy(float)
    hits = pd.to_numeric(decisions["prefix_hit_tokens"], errors="coerce").fillna(0).to_numpy(float)
    return (decisions["event"] == "schedule").to_numpy() & (computed == hits)


class QueueIndex:
    """Admission intervals and preemptions per request, so each step's queues cost one vectorised pass.

    From the `decisions` and `requests` tables:
    - A request is *admitted* by a `schedule` row whose `num_computed_tokens` equals its `prefix_hit_tokens`
      (the recorder writes a request's starting point when it enters the running queue, first time or
      after a preemption, and 0 prefix hits on every later row, whose computed count is then > 0).
    - *Running* after step s: admitted at some step a <= s, with no `preempt`/`finish`/`abort` row for it
      in steps a..s. Order: by admission step (the scheduler appends admissions to `running`); within a
      step by waiting-queue order (fcfs: resumed requests first, then new ones, each as recorded;
      priority: (priority, arrival, request id)). The last running request is the next FCFS victim.
    - *Waiting* after step s: queued at or before step s's start (`queued` <= `start`), not running, and
      not finished, aborted or rejected by step s. Order: fcfs puts preempted requests at the front, the
      most recently preempted first (they are prepended), then the others by (queued, arrival);
      priority orders all by (priority, arrival, request id), the scheduler's heap order.
    """

    def __init__(self, decisions: pd.DataFrame, requests: pd.DataFrame, policy: str = "fcfs") -> None:
        self.policy = policy
        self.ids = requests["request_id"].to_numpy(dtype=object)
        nreq = len(self.ids)
        rid_pos = pd.Index(requests["request_id"])
        event = decisions["event"]
        admit = admissions(decisions)
        term = event.isin(("preempt", "finish", "abort", "reject")).to_numpy()
        rows = np.flatnonzero(admit | term)
        sub = decisions.iloc[rows]
        code = rid_pos.get_indexer(sub["request_id"])
        known = code >= 0
        rows, code = rows[known], code[known]
        step = sub["step"].to_numpy(np.int64)[known]
        is_admit = admit[rows]
        ev = event.iloc[rows].to_numpy(dtype=object)
        order = np.lexsort((rows, code))
        rows, code, step, is_admit, ev = rows[order], code[order], step[order], is_admit[order], ev[order]
        same_next = np.r_[code[1:] == code[:-1], False]
        same_prev = np.r_[False, code[1:] == code[:-1]]
        next_step = np.r_[step[1:], INF]
        resumed = same_prev & np.r_[False, ev[:-1] == "preempt"]
        a = np.flatnonzero(is_admit)
        iv_end = np.where(same_next[a], next_step[a], INF)
        self.iv_code, self.iv_start, self.iv_end = code[a], step[a], iv_end
        prio = requests["priority"].fillna(0).to_numpy(float) if "priority" in requests else np.zeros(nreq)
        arrival = pd.to_numeric(requests["arrival"], errors="coerce").fillna(np.inf).to_numpy(float)
        queued = pd.to_numeric(requests["queued"], errors="coerce").to_numpy(float)
        self.queued = np.where(np.isnan(queued), arrival, queued)
        self.prio_rank = _rank(self.ids, prio, arrival)
        self.fcfs_rank = _rank(np.arange(nreq), self.queued, arrival)
        if policy == "priority":
            iv_order = np.lexsort((self.prio_rank[self.iv_code], self.iv_start))
        else:
            iv_order = np.lexsort((rows[a], ~resumed[a], self.iv_start))
        self.iv_code, self.iv_start = self.iv_code[iv_order], self.iv_start[iv_order]
        self.iv_end = self.iv_end[iv_order]
        ends = np.isin(ev, ("finish", "abort", "reject"))
        self.req_end = np.full(nreq, INF, np.int64)
        np.minimum.at(self.req_end, code[ends], step[ends])
        reasons = requests["finish_reason"].to_numpy(dtype=object) if "finish_reason" in requests else None
        if reasons is not None:
            self.req_end[reasons == "error"] = -1
        pre = ev == "preempt"
        self.pre_code, self.pre_step, self.pre_row = code[pre], step[pre], rows[pre]

    def running_at(self, step: int) -> np.ndarray:
        """Request positions (rows of the requests table) running after `step`, in queue order."""
        return self.running_since(step)[0]

    def running_since(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(request positions, the step each was admitted at) running after `step`."""
        m = (self.iv_start <= step) & (self.iv_end > step)
        return self.iv_code[m], self.iv_start[m]

    def waiting_at(self, step: int, start: float) -> np.ndarray:
        """Request positions waiting after `step` (which started at `start`), front of the queue first."""
        return self.waiting_detail(step, start)[0]

    def waiting_detail(self, step: int, start: float) -> tuple[np.ndarray, np.ndarray]:
        """(waiting request positions, whether each is back in the queue after a preemption)."""
        alive = (self.queued <= start) & (self.req_end > step)
        alive[self.running_at(step)] = False
        cand = np.flatnonzero(alive)
        if self.policy == "priority" or not len(cand):
            cand = cand[np.argsort(self.prio_rank[cand], kind="stable")]
            return cand, np.isin(cand, self.pre_code[self.pre_step <= step])
        last = np.full(len(self.ids), -1, np.int64)
        m = self.pre_step <= step
        np.maximum.at(last, self.pre_code[m], self.pre_row[m])
        lp = last[cand]
        front = cand[lp >= 0][np.argsort(-lp[lp >= 0], kind="stable")]
        rest = cand[lp < 0]
        order = np.concatenate([front, rest[np.argsort(self.fcfs_rank[rest], kind="stable")]])
        return order, np.arange(len(order)) < len(front)

    def queues_at(self, step: int, start: float) -> tuple[list[str], list[str]]:
        """(running, waiting) request ids after `step`."""
        return list(self.ids[self.running_at(step)]), list(self.ids[self.waiting_at(step, start)])


def _rank(tie: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Rank of each row under the sort by keys[0], keys[1], ..., then `tie`."""
    order = np.lexsort((tie.astype(str) if tie.dtype == object else tie, *reversed(keys)))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank
