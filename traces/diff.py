"""Which steps two traces decided alike: the one definition of a divergent step, shared by `sim compare`
and the TUI's compare view.

A step matches when both traces made the same decisions in it, as multisets of rows (request, event,
tokens, phase, computed tokens, prefix hits, blocks gained and freed, finish reason), whatever order they
wrote them in; a step present in one trace only diverges. Step times never count. `explain_step` says,
request by request, how a divergent step differs (both tools print it).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

_NUM = ("num_tokens", "num_computed_tokens", "prefix_hit_tokens")
_STR = ("request_id", "event", "phase", "finish_reason")
_LISTS = ("blocks_gained", "blocks_freed")
# Past this many steps the aligned count is skipped: difflib's matching is quadratic at worst.
MAX_ALIGNED_STEPS = 200_000


def _ids(v: Any) -> bytes:
    """A block id list as int64 bytes: hashable, and cheap for Parquet's numpy arrays."""
    if isinstance(v, np.ndarray) and v.dtype == np.int64:
        return v.tobytes()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return b""
    return np.asarray([int(x) for x in v], dtype=np.int64).tobytes()


def ids_list(b: bytes) -> list[int]:
    return np.frombuffer(b, dtype=np.int64).tolist()


def normalized_decisions(decisions: pd.DataFrame) -> pd.DataFrame:
    """Decisions with comparable cells: missing numbers -1, missing strings '', block lists as bytes."""
    d = pd.DataFrame({"step": decisions["step"].to_numpy(dtype=np.int64)})
    for c in _STR:
        d[c] = decisions[c].astype(object).where(decisions[c].notna(), "").astype(str).to_numpy()
    for c in _NUM:
        d[c] = pd.to_numeric(decisions[c]).fillna(-1).astype(np.int64).to_numpy()
    for c in _LISTS:
        d[c] = [_ids(v) for v in decisions[c]]
    return d


def step_digests(d: pd.DataFrame, num_steps: int) -> np.ndarray:
    """One order-free fingerprint per step (sum of row hashes, mod 2**64); 0 for a step with no rows."""
    cols = ["request_id", "event", *_NUM, "phase", *_LISTS, "finish_reason"]
    columns = [d[c].to_numpy(dtype=object) for c in cols]  # iterating Arrow-backed columns is slow
    hashes = np.fromiter((hash(row) & 0xFFFFFFFFFFFFFFFF for row in zip(*columns)),
                         dtype=np.uint64, count=len(d))
    steps = d["step"].to_numpy()
    out = np.zeros(max(num_steps, int(steps.max()) + 1 if len(steps) else 0), dtype=np.uint64)
    if len(d):
        order = np.argsort(steps, kind="stable")
        s, h = steps[order], hashes[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        out[s[starts]] = np.add.reduceat(h, starts)
    return out


def matching_steps(decisions_a: pd.DataFrame, num_steps_a: int, decisions_b: pd.DataFrame,
                   num_steps_b: int) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame]:
    """(same, da, db): `same[i]` tells whether step i matches, for every step of the longer trace, and the
    normalized decisions of both (for explaining a divergence)."""
    da, db = normalized_decisions(decisions_a), normalized_decisions(decisions_b)
    n = max(num_steps_a, num_steps_b)
    ga, gb = step_digests(da, n), step_digests(db, n)
    n = max(n, len(ga), len(gb))
    ga, gb = np.pad(ga, (0, n - len(ga))), np.pad(gb, (0, n - len(gb)))
    same = ga == gb
    same[min(num_steps_a, num_steps_b):] = False
    return same, da, db


def aligned_pairs(da: pd.DataFrame, num_steps_a: int, db: pd.DataFrame, num_steps_b: int) -> np.ndarray | None:
    """For each step of A, the step of B it matches once the two traces are aligned around steps one has
    and the other lacks, or -1: a burst taken in two steps rather than one shifts every later step's
    index, so comparing by index calls all of them divergent even where the decisions agree again. The
    pairs are difflib's matching blocks over the per-step digests; None past MAX_ALIGNED_STEPS steps."""
    if max(num_steps_a, num_steps_b) > MAX_ALIGNED_STEPS:
        return None
    ga, gb = step_digests(da, num_steps_a)[:num_steps_a], step_digests(db, num_steps_b)[:num_steps_b]
    matcher = difflib.SequenceMatcher(None, ga.tolist(), gb.tolist(), autojunk=False)
    pairs = np.full(num_steps_a, -1, dtype=np.int64)
    for block in matcher.get_matching_blocks():
        pairs[block.a:block.a + block.size] = np.arange(block.b, block.b + block.size)
    return pairs


def index_pairs(same: np.ndarray, num_steps_a: int) -> np.ndarray:
    """`aligned_pairs`' form of the by-index match: step i of A pairs with step i of B where they match."""
    return np.where(same[:num_steps_a], np.arange(num_steps_a), -1)


@dataclass(slots=True)
class RequestDifference:
    """What one request did differently in a step: the differences in words, and its rows in A and in B
    (per event; a schedule row as its numbers, a preempt or finish as what it freed and why)."""

    request_id: str
    differences: list[str]
    a: dict[str, Any]
    b: dict[str, Any]


def _describe_rows(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows.itertuples(index=False):
        if r.event == "schedule":
            out["schedule"] = {"num_tokens": int(r.num_tokens), "phase": r.phase,
                               "num_computed_tokens": int(r.num_computed_tokens),
                               "prefix_hit_tokens": int(r.prefix_hit_tokens),
                               "blocks_gained": ids_list(r.blocks_gained)}
        else:
            out[r.event] = {"blocks_freed": ids_list(r.blocks_freed), "finish_reason": r.finish_reason or None}
    return out


def explain_step(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> list[RequestDifference]:
    """Per request whose rows differ between A's and B's rows of one step (as `normalized_decisions`
    gives them), in request id order."""
    diffs = []
    for rid in sorted(set(rows_a["request_id"]) | set(rows_b["request_id"])):
        ra = _describe_rows(rows_a[rows_a["request_id"] == rid])
        rb = _describe_rows(rows_b[rows_b["request_id"] == rid])
        if ra == rb:
            continue
        what = []
        sa, sb = ra.get("schedule"), rb.get("schedule")
        if sa is None or sb is None:
            for side, row in (("A", sa), ("B", sb)):
                if row is not None:
                    what.append(f"scheduled in {side} only ({row['num_tokens']} tokens, {row['phase']})")
        else:
            for key, label in (("num_tokens", "tokens"), ("phase", "phase"), ("num_computed_tokens", "computed tokens"),
                               ("prefix_hit_tokens", "prefix hits"), ("blocks_gained", "blocks gained")):
                if sa[key] != sb[key]:
                    what.append(f"{label}: {sa[key]} vs {sb[key]}")
        for event, label in (("preempt", "preempted"), ("finish", "finished"), ("abort", "aborted"),
                             ("reject", "rejected")):
            ea, eb = ra.get(event), rb.get(event)
            if (ea is None) != (eb is None):
                what.append(f"{label} in " + ("A" if ea else "B") + " only")
            elif ea is not None and eb is not None and ea != eb:
                what.append(f"{label}: blocks freed {ea['blocks_freed']} vs {eb['blocks_freed']}, "
                            f"reason {ea['finish_reason']} vs {eb['finish_reason']}")
        diffs.append(RequestDifference(rid, what or ["rows differ"], ra, rb))
    return diffs
