"""Rebuild the block pool at any step from a trace: the nearest snapshot at or before the step (or the
state last asked for, when that is nearer), then the block events after it, applied in bulk with numpy.
A 665k-step trace's pool is ready without converting its half million events to Python objects, and a
step forth replays only that step's events."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from traces.reader import Trace

FREE, CACHED_FREE, HELD = "free", "cached", "held"
KINDS = ("new", "hit", "cache", "free")  # the block event kinds the KV cache manager logs, in code order
NEW, HIT, CACHE, FREE_EVENT = range(len(KINDS))


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


@dataclass(slots=True)
class HashValues:
    """The trace's hash strings, left in Arrow: the block events' hashes flattened, then the snapshots'
    hash column; a reference is a row of the two one after the other."""
    events: Any
    snapshots: Any

    def at(self, ref: int) -> str | None:
        n = len(self.events)
        return (self.events[ref] if ref < n else self.snapshots[ref - n]).as_py()


@dataclass(slots=True)
class PoolState:
    """The pool after `step`, by block id (0, the null block, included): holders as tuples, so a copy is
    a shallow list copy that shares them; a hash as its row in `hash_values` (-1: none), as turning every
    cached block's hash into a Python string would cost more than the replay itself."""
    step: int
    holders: list[tuple[str, ...]]
    cached: np.ndarray
    hash_refs: np.ndarray
    hash_values: HashValues

    @classmethod
    def empty(cls, num_blocks: int, hash_values: HashValues) -> PoolState:
        return cls(-1, [()] * num_blocks, np.zeros(num_blocks, bool), np.full(num_blocks, -1, np.int64), hash_values)

    def copy(self) -> PoolState:
        return PoolState(self.step, self.holders.copy(), self.cached.copy(), self.hash_refs.copy(), self.hash_values)

    @property
    def num_blocks(self) -> int:
        """Blocks 1..N-1, the ones a view shows."""
        return len(self.holders) - 1

    def block(self, block_id: int) -> BlockInfo:
        ref = int(self.hash_refs[block_id])
        h = self.hash_values.at(ref) if ref >= 0 else None
        return BlockInfo(block_id, sorted(self.holders[block_id]), bool(self.cached[block_id]), h)

    def blocks(self) -> list[BlockInfo]:
        """Blocks 1..N-1 (block 0 is the null block and is left out)."""
        return [self.block(b) for b in range(1, len(self.holders))]

    def ref_counts(self) -> np.ndarray:
        """Holders of blocks 1..N-1."""
        return np.fromiter(map(len, self.holders), np.int32, len(self.holders))[1:]

    def held_by(self, rid: str) -> np.ndarray:
        """Whether `rid` holds each of blocks 1..N-1."""
        return np.fromiter((rid in h for h in self.holders), bool, len(self.holders))[1:]

    def cached_flags(self) -> np.ndarray:
        return self.cached[1:]


def _as_arrow(col: pd.Series) -> Any:
    """A column as one Arrow array, whether pandas holds it in Arrow or as Python objects."""
    import pyarrow as pa

    if isinstance(col.dtype, pd.ArrowDtype):
        arr = pa.array(col.array)
    elif col.dtype != object:  # numbers, strings, categories: converted by Arrow in C
        arr = pa.array(col, from_pandas=True)
    else:  # list cells as traces.load leaves them: an array per row, None or NaN for a missing one
        arr = pa.array([None if v is None or isinstance(v, float) else list(v) if isinstance(v, np.ndarray) else v
                        for v in col], from_pandas=True)
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _in_step_order(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`df` sorted by `keys` (the writers already leave it so: then it is returned as is)."""
    if not len(df):
        return df
    order = np.lexsort([df[k].to_numpy() for k in reversed(keys)])
    if (order == np.arange(len(order))).all():
        return df.reset_index(drop=True)
    return df.iloc[order].reset_index(drop=True)


def _offsets(arr: Any) -> np.ndarray:
    """A list array's row offsets into its flattened values (which start at 0 for a sliced array too)."""
    off = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return off - off[0]


class BlockPoolIndex:
    """The pool at any step: the latest snapshot at or before it (or the state last asked for, when that
    is nearer), then the block events since, applied in bulk: each block's cached flag and hash come from
    its last new or cache; its holders from its last new, then the hits and frees after it in
    order, the only per-block-operation work done in Python."""

    def __init__(self, block_events: pd.DataFrame, block_snapshots: pd.DataFrame, num_blocks: int) -> None:
        import pyarrow as pa

        self.num_blocks = num_blocks
        ev = _in_step_order(block_events, ["step", "seq"])
        n = len(ev)
        self._ev_steps = ev["step"].to_numpy(np.int64) if n else np.zeros(0, np.int64)
        ids = _as_arrow(ev["block_ids"]) if n else pa.array([], pa.list_(pa.int64()))
        self._ev_off = _offsets(ids)
        self._op_blk = ids.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        self._ev_kind = pd.Categorical(ev["kind"], categories=KINDS).codes if n else np.zeros(0, np.int8)
        rid_codes, rids = pd.factorize(ev["request_id"], use_na_sentinel=False) if n else (np.zeros(0, np.int64), [])
        self._ev_rid, self._rids = rid_codes, np.asarray(rids, dtype=object)
        event_hashes = _as_arrow(ev["hashes"]) if n else pa.array([], pa.list_(pa.large_string()))
        self._hash_off = _offsets(event_hashes)
        snaps = _in_step_order(block_snapshots, ["step"])
        self._snaps = snaps
        steps = snaps["step"].to_numpy() if len(snaps) else np.zeros(0, np.int64)
        self._snap_steps, self._snap_lo = np.unique(steps, return_index=True)
        self._snap_hi = np.r_[self._snap_lo[1:], len(steps)].astype(np.int64)
        snap_hashes = _as_arrow(snaps["hash"]) if len(snaps) else pa.array([], pa.large_string())
        self._hash_values = HashValues(event_hashes.flatten(), snap_hashes)
        self._snap_states: dict[int, PoolState] = {}
        self._last: tuple[int, PoolState] | None = None  # (next event row, state) of the last request

    @classmethod
    def from_trace(cls, trace: Trace) -> BlockPoolIndex:
        total = int(trace.steps["kv_blocks_total"].iloc[0]) + 1 if len(trace.steps) else 1
        return cls(trace.block_events, trace.block_snapshots, total)

    def state_at(self, step: int) -> list[BlockInfo]:
        """Blocks 1..N-1 after `step` completed (block 0 is the null block and is left out)."""
        return self.pool_at(step).blocks()

    def pool_at(self, step: int) -> PoolState:
        """The pool after `step` completed; the caller owns the copy it gets."""
        hi = int(np.searchsorted(self._ev_steps, step, side="right"))
        row, state = self._start(step, hi)
        self._replay(state, row, hi)
        state.step = step
        self._last = (hi, state)
        return state.copy()

    def _start(self, step: int, hi: int) -> tuple[int, PoolState]:
        """The latest known state at or before `step`: (the event row to replay from, a state to mutate).
        Replays never cross a snapshot: a state after the latest snapshot at or before `step` comes from
        it, as the trace's own snapshot is what it says the pool was."""
        i = int(np.searchsorted(self._snap_steps, step, side="right")) - 1
        if i < 0:
            row, base = 0, -1
        else:
            base = int(self._snap_steps[i])
            row = int(np.searchsorted(self._ev_steps, base, side="right"))
        if self._last is not None and row <= self._last[0] <= hi and base <= self._last[1].step <= step:
            return self._last
        if i < 0:
            return row, PoolState.empty(self.num_blocks, self._hash_values)
        return row, self._snapshot(i).copy()

    def _replay(self, state: PoolState, lo: int, hi: int) -> None:
        """Apply events lo..hi-1 to `state`, as the KV cache manager logged them."""
        a, b = int(self._ev_off[lo]), int(self._ev_off[hi]) if hi > lo else 0
        if b <= a:
            return
        blk = self._op_blk[a:b]
        ev = np.repeat(np.arange(lo, hi), np.diff(self._ev_off[lo:hi + 1]))
        kind, opi = self._ev_kind[ev], np.arange(b - a)
        last = np.full(self.num_blocks, -1, np.int64)
        hashed = self._hash_off[ev + 1] - self._hash_off[ev] > a + opi - self._ev_off[ev]  # a hash logged
        m = (kind == NEW) | (kind == CACHE) & hashed
        np.maximum.at(last, blk[m], opi[m])
        touched = np.flatnonzero(last >= 0)
        op = last[touched]
        cache = kind[op] == CACHE
        state.cached[touched] = cache
        e = ev[op]
        state.hash_refs[touched] = np.where(cache, self._hash_off[e] + (a + op - self._ev_off[e]), -1)
        last.fill(-1)
        m = kind == NEW
        np.maximum.at(last, blk[m], opi[m])
        holders, rids = state.holders, self._rids
        renewed = np.flatnonzero(last >= 0)
        for bk, r in zip(renewed.tolist(), rids[self._ev_rid[ev[last[renewed]]]].tolist()):
            holders[bk] = (r,)
        rest = np.flatnonzero(((kind == HIT) | (kind == FREE_EVENT)) & (opi > last[blk]))
        for bk, k, r in zip(blk[rest].tolist(), kind[rest].tolist(), rids[self._ev_rid[ev[rest]]].tolist()):
            h = holders[bk]
            if k == HIT:
                holders[bk] = h + (r,)
            elif h == (r,):
                holders[bk] = ()
            elif r in h:
                i = h.index(r)
                holders[bk] = h[:i] + h[i + 1:]

    def _snapshot(self, i: int) -> PoolState:
        """Snapshot `i` (in step order) as a state, converted on first use."""
        got = self._snap_states.get(i)
        if got is None:
            got = self._snap_states[i] = self._convert_snapshot(i)
        return got

    def _convert_snapshot(self, i: int) -> PoolState:
        lo, hi = int(self._snap_lo[i]), int(self._snap_hi[i])
        rows = self._snaps.iloc[lo:hi]
        state = PoolState.empty(self.num_blocks, self._hash_values)
        state.step = int(self._snap_steps[i])
        bids = rows["block_id"].to_numpy(np.int64)
        for bid, hs in zip(bids.tolist(), _as_arrow(rows["holders"]).to_pylist()):
            state.holders[bid] = tuple(hs) if hs else ()
        state.cached[bids] = rows["cached"].fillna(False).to_numpy(bool)
        has_hash = self._hash_values.snapshots.slice(lo, hi - lo).is_valid().to_numpy(zero_copy_only=False)
        state.hash_refs[bids] = np.where(has_hash, len(self._hash_values.events) + np.arange(lo, hi), -1)
        return state
