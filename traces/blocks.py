"""Rebuild the block pool at any step from a trace: the nearest snapshot at or before the step, then
the block events after it, so step 90,000 of a long run costs at most `snapshot_every` steps of replay."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.frames import list_cell

FREE, CACHED_FREE, HELD = "free", "cached", "held"


@dataclass(slots=True)
class BlockInfo:
    block_id: int
    holders: list[str]
    cached: bool
    hash: str | None

    @property
    def state(self) -> str:
        if self.holders:
            return HELD
        return CACHED_FREE if self.cached else FREE

    @property
    def ref_cnt(self) -> int:
        return len(self.holders)


class BlockPoolIndex:
    def __init__(self, block_events: pd.DataFrame, block_snapshots: pd.DataFrame, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        ev = block_events.sort_values(["step", "seq"], kind="stable").reset_index(drop=True)
        self._ev_steps = ev["step"].to_numpy()
        self._ev = list(zip(ev["kind"], ev["request_id"], ev["block_ids"], ev["hashes"]))
        snaps = block_snapshots.sort_values("step", kind="stable").reset_index(drop=True)
        self._snap_steps = np.unique(snaps["step"].to_numpy())
        self._snaps = {int(s): g for s, g in snaps.groupby("step")} if len(snaps) else {}

    @classmethod
    def from_trace(cls, trace) -> BlockPoolIndex:
        total = int(trace.steps["kv_blocks_total"].iloc[0]) + 1 if len(trace.steps) else 1
        return cls(trace.block_events, trace.block_snapshots, total)

    def state_at(self, step: int) -> list[BlockInfo]:
        """Blocks 1..N-1 after `step` completed (block 0 is the null block and is left out)."""
        holders: list[list[str]] = [[] for _ in range(self.num_blocks)]
        cached = [False] * self.num_blocks
        hashes: list[str | None] = [None] * self.num_blocks
        i = np.searchsorted(self._snap_steps, step, side="right") - 1
        base = -1
        if i >= 0:
            base = int(self._snap_steps[i])
            snap = self._snaps[base]
            for bid, hs, c, h in zip(snap["block_id"], snap["holders"], snap["cached"], snap["hash"]):
                holders[bid] = list(hs)
                cached[bid] = bool(c)
                hashes[bid] = h if isinstance(h, str) else None
        lo = np.searchsorted(self._ev_steps, base, side="right")
        hi = np.searchsorted(self._ev_steps, step, side="right")
        for kind, rid, ids, hs in self._ev[lo:hi]:
            if kind == "new":
                for b in ids:
                    holders[b] = [rid]
                    cached[b] = False
                    hashes[b] = None
            elif kind == "hit":
                for b in ids:
                    holders[b].append(rid)
            elif kind == "cache":
                for b, h in zip(ids, list_cell(hs)):
                    cached[b] = True
                    hashes[b] = h
            elif kind == "free":
                for b in ids:
                    if rid in holders[b]:
                        holders[b].remove(rid)
            elif kind == "uncache":
                for b in ids:
                    cached[b] = False
                    hashes[b] = None
        return [BlockInfo(b, sorted(holders[b]), cached[b], hashes[b]) for b in range(1, self.num_blocks)]
