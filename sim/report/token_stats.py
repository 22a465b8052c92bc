"""Which rows of a decisions table emit an output token, and the per-token figures of a replay (inter-token
latencies, tokens out over time) built from them, in memory (`token_times`) or streamed a batch at a time
(`TokenStream`): a 200k-request replay has ~15M decision rows, and holding them as a DataFrame, plus the
sorted per-token arrays, costs more than a gigabyte.

The rule (`emitting_rows`, written once for both): a request emits a token in a step that computes its
last known token, i.e. every decode row, and a prefill row that completes the prompt (the request's next
row is a decode, or it finishes in that step); the token's time is the step's end. Walking the rows in
step order, a prefill is held per request until that request's next row (or the end) settles it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from traces.metrics import inter_token_latencies

if TYPE_CHECKING:
    import numpy.typing as npt
    import pyarrow as pa


@dataclass(slots=True)
class TokenStats:
    """`itl`: every inter-token latency that has a value (NaN-free, in no particular order); `times` and
    `counts`: tokens out at each step end time, what the throughput curve bins."""

    itl: np.ndarray
    times: np.ndarray
    counts: np.ndarray

    @classmethod
    def from_token_times(cls, codes: np.ndarray, times: np.ndarray) -> TokenStats:
        """From `token_times`' per-token arrays."""
        itl = inter_token_latencies(codes, times)
        t, n = np.unique(times[~np.isnan(times)], return_counts=True)
        return cls(itl[~np.isnan(itl)], t, n)

    def itl_percentiles(self, qs: Sequence[float]) -> list[float]:
        """np.percentile of the ITLs for each of `qs`, figure for figure, partitioning `itl` in place (its
        order is free) rather than copying ~15M values; NaN without ITLs."""
        if not len(self.itl):
            return [math.nan] * len(qs)
        return [float(v) for v in np.percentile(self.itl, list(qs), overwrite_input=True)]

    def histogram(self, bins: int) -> tuple[np.ndarray, np.ndarray]:
        """np.histogram of the tokens' times, bin for bin the same as over one time per token."""
        return np.histogram(self.times, bins=bins, weights=self.counts)


class _StepEnds:
    """Step number -> end time (NaN when missing)."""

    def __init__(self, steps: pd.DataFrame) -> None:
        step_no = steps["step"].to_numpy(dtype=np.int64)
        order = np.argsort(step_no, kind="stable")
        self.step_no = step_no[order]
        self.end = steps["end"].to_numpy(dtype=float)[order]
        # Steps numbered 0, 1, 2, ... (every run's): a subtraction finds them, no search.
        self.dense = bool(len(step_no)) and bool((np.diff(self.step_no) == 1).all())

    def find(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(end time or NaN, position in the sorted steps, found) per step number."""
        n = len(self.step_no)
        if not n:
            return np.full(len(steps), np.nan), np.zeros(len(steps), dtype=np.int64), np.zeros(len(steps), dtype=bool)
        if self.dense:
            pos = steps - self.step_no[0]
            found = (pos >= 0) & (pos < n)
            pos = np.clip(pos, 0, n - 1)
        else:
            pos = np.minimum(np.searchsorted(self.step_no, steps), n - 1)
            found = self.step_no[pos] == steps
        return np.where(found, self.end[pos], np.nan), pos, found


def emitting_rows(code: np.ndarray, decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(emits, last) over schedule rows grouped by request, each request's rows in step order: a decode row
    emits, and so does a prefill row followed by a decode of its request. A request's last row, where it
    is a prefill, emits only if the request finished in that step, which the caller alone can tell:
    `emits` is False there."""
    last = np.r_[code[1:] != code[:-1], True]
    return decode | (np.r_[decode[1:], False] & ~last), last


def token_times(decisions: pd.DataFrame, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(request codes, times) of every output token, sorted by request then time, the whole decisions
    table at once. Arrays are 32-bit and the finish lookup touches only each request's last row: a long
    replay has tens of millions of rows."""
    event = decisions["event"]
    is_sched = (event == "schedule").to_numpy(dtype=bool)
    if not is_sched.any():
        return np.empty(0, dtype=np.int32), np.empty(0)
    rid = decisions["request_id"]
    codes = (rid.cat.codes.to_numpy() if isinstance(rid.dtype, pd.CategoricalDtype)
             else pd.factorize(rid)[0]).astype(np.int32, copy=False)
    is_fin = (event == "finish").to_numpy(dtype=bool)
    step_all = decisions["step"].to_numpy().astype(np.int32, copy=False)
    fin_keys = codes[is_fin].astype(np.int64) << 32 | step_all[is_fin]
    code, step = codes[is_sched], step_all[is_sched]
    decode = (decisions["phase"] == "decode").to_numpy(dtype=bool)[is_sched]
    del codes, step_all, is_fin, is_sched
    # Rows are written in step order; a stable sort by request then keeps each request's steps in order.
    order = np.argsort(code, kind="stable") if (np.diff(step) >= 0).all() else np.lexsort((step, code))
    code, step, decode = code[order], step[order], decode[order]
    del order
    emit, last = emitting_rows(code, decode)
    pending = np.flatnonzero(last & ~decode)
    emit[pending] = np.isin(code[pending].astype(np.int64) << 32 | step[pending], fin_keys)
    return code[emit], _StepEnds(steps).find(step[emit].astype(np.int64))[0]


class TokenStream:
    """Feed `add(code, step, scheduled, finished, decode)` row arrays in step order, then `result()`.
    `add` returns False (and the stream is void) when rows go back in step: the caller then sorts in memory."""

    def __init__(self, steps: pd.DataFrame, max_rows: int | None = None) -> None:
        self.ends = _StepEnds(steps)
        self.counts = np.zeros(len(self.ends.step_no), dtype=np.int64)
        self.itl = _Latencies(max_rows)
        size = 1024
        self.pending = np.full(size, -1, dtype=np.int64)  # step of a prefill row not settled yet
        self.has_pending = np.zeros(size, dtype=bool)
        self.finish = np.full(size, -1, dtype=np.int64)
        self.has_finish = np.zeros(size, dtype=bool)
        self.last_time = np.full(size, np.nan)  # of each request's latest token; NaN makes no ITL
        self.last_step: int | None = None

    def _grow(self, n: int) -> None:
        size = len(self.pending)
        if n <= size:
            return
        new = max(n, 2 * size)
        for name, fill in (("pending", -1), ("has_pending", False), ("finish", -1), ("has_finish", False),
                           ("last_time", np.nan)):
            old = getattr(self, name)
            grown = np.full(new, fill, dtype=old.dtype)
            grown[:size] = old
            setattr(self, name, grown)

    def add(self, code: np.ndarray, step: np.ndarray, scheduled: np.ndarray, finished: np.ndarray,
            decode: np.ndarray) -> bool:
        if not len(step):
            return True
        if (self.last_step is not None and step[0] < self.last_step) or (np.diff(step) < 0).any():
            return False
        self.last_step = int(step[-1])
        self._grow(int(code.max()) + 1)
        self.finish[code[finished]] = step[finished]
        self.has_finish[code[finished]] = True
        c, s, d = code[scheduled], step[scheduled], decode[scheduled]
        if not len(c):
            return True
        order = np.argsort(c, kind="stable")  # rows are in step order, so each request's stay in it
        c, s, d = c[order], s[order], d[order]
        emit, last = emitting_rows(c, d)
        first = np.r_[True, last[:-1]]
        # A prefill left pending by an earlier batch emits if this request's next row is a decode.
        head = c[first]
        settled = self.has_pending[head] & d[first]
        early_c, early_s = head[settled], self.pending[head[settled]]
        tail = c[last]
        self.has_pending[tail] = ~d[last]
        self.pending[tail] = s[last]
        # Earlier tokens first: a settled prefill precedes its request's rows of this batch.
        ec, es = np.concatenate([early_c, c[emit]]), np.concatenate([early_s, s[emit]])
        order = np.argsort(ec, kind="stable")
        self._emit(ec[order], es[order])
        return True

    def _emit(self, code: np.ndarray, step: np.ndarray) -> None:
        """Tokens grouped by request, each request's in time order."""
        if not len(code):
            return
        times, pos, found = self.ends.find(step)
        self.counts += np.bincount(pos[found], minlength=len(self.counts))
        prev = np.empty_like(times)
        prev[1:] = times[:-1]
        first = np.r_[True, code[1:] != code[:-1]]
        prev[first] = self.last_time[code[first]]
        itl = times - prev
        self.itl.add(itl[~np.isnan(itl)])
        last = np.r_[code[1:] != code[:-1], True]
        self.last_time[code[last]] = times[last]

    def result(self) -> TokenStats:
        """Settle the prefills still pending (they emit if the request finished in that step) and gather."""
        n = len(self.pending)
        ids = np.flatnonzero(self.has_pending[:n] & self.has_finish[:n] & (self.pending[:n] == self.finish[:n]))
        self._emit(ids, self.pending[ids])
        nz = np.flatnonzero(self.counts)
        return TokenStats(self.itl.array(), self.ends.end[nz], self.counts[nz])


class _Latencies:
    """The ITLs gathered batch by batch. With an upper bound on their number (a token per decision row at
    most, known from a Parquet file's footer) they go straight into one array whose untouched tail never
    becomes resident; without one, into chunks joined at the end, each freed once copied."""

    def __init__(self, max_rows: int | None) -> None:
        self.buffer = np.empty(max_rows) if max_rows is not None else None
        self.chunks: list[np.ndarray] = []
        self.size = 0

    def add(self, values: np.ndarray) -> None:
        if self.buffer is not None:
            self.buffer[self.size:self.size + len(values)] = values
        else:
            self.chunks.append(values)
        self.size += len(values)

    def array(self) -> np.ndarray:
        if self.buffer is not None:
            return self.buffer[:self.size]
        out = np.empty(self.size)
        at = 0
        self.chunks.reverse()
        while self.chunks:
            c = self.chunks.pop()
            out[at:at + len(c)] = c
            at += len(c)
        return out


def stream_token_stats(batches: Iterable[pa.RecordBatch], steps: pd.DataFrame, last_step: int | None,
                       request_ids: npt.ArrayLike = (), max_rows: int | None = None) -> TokenStats | None:
    """TokenStats from decision record batches (columns step, request_id, event, phase), rows beyond
    `last_step` dropped (a trace cut short); None when the rows are not in step order. `request_ids`
    (the requests table's) are looked up in one hash table; any other id through a dict. `max_rows`:
    how many rows there are at most, when known."""
    stream = TokenStream(steps, max_rows)
    ids = _RequestCodes(request_ids)
    for batch in batches:
        step = _column(batch, "step").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        keep = slice(None) if last_step is None else step <= last_step
        code = ids.codes(_column(batch, "request_id"))[keep]
        event = _column(batch, "event")
        row = (code, step[keep], _equals(event, "schedule")[keep], _equals(event, "finish")[keep],
               _equals(_column(batch, "phase"), "decode")[keep])
        if not stream.add(*row):
            return None
    return stream.result()


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    return batch.column(batch.schema.get_field_index(name))


def _dictionary(arr: pa.Array) -> tuple[list[str], np.ndarray]:
    """(distinct values, per-row index into them, len(values) for a null row) of a string column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    index = pc.fill_null(arr.indices, len(arr.dictionary)).to_numpy(zero_copy_only=False)
    return arr.dictionary.to_pylist(), index


class _RequestCodes:
    """Request id -> dense integer code, the same id the same code in every batch: looked up in one hash
    table of the requests table's ids (built once), a dict only for ids it lacks (a run cut short)."""

    def __init__(self, known: npt.ArrayLike) -> None:
        self.known = pd.Index(known).unique()
        self.extra: dict[str | None, int] = {}

    def codes(self, arr: pa.Array) -> np.ndarray:
        values, index = _dictionary(arr)
        lookup = np.append(self.known.get_indexer(values), -1).astype(np.int64)
        missing = np.flatnonzero(lookup < 0)
        if len(missing):
            names = [*values, None]
            base = len(self.known)
            lookup[missing] = [base + self.extra.setdefault(names[i], len(self.extra)) for i in missing]
        return lookup[index]


def _equals(arr: pa.Array, value: str) -> np.ndarray:
    values, index = _dictionary(arr)
    return np.array([v == value for v in values] + [False], dtype=bool)[index]
