"""Row runs: many rows of a table handed over as a few lists, turned into Arrow without a Python value
per cell.

Most steps of a long run are all decodes, and each decode's decision row differs from the next only in
its request, computed count and new block ids; the rest (the step, `schedule`, 1 token, `decode`, no
hit, nothing freed) is the same for the whole step. A batched writer (`TraceWriter.run_buffer`) takes
such a step as one entry `(position, count, *per_run, *per_row)`: `position` is how many of the table's
buffered rows come before it, `per_run` values are repeated `count` times, `per_row` values are lists
of `count`. At each flush the runs become one record batch, built column by column in C, and are merged
into the buffered rows at their positions, so the stream holds exactly the rows the buffer alone would.

A decode run of k steps by n requests (`GridSpec`) is one entry with no list of its n * k rows at all:
its first step, its requests, their computed counts and the few block ids gained; the rows are made in
numpy at the flush.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

# A run as a writer buffers it: (position, count, then the spec's values in its order).
RunEntry = tuple[Any, ...]


@dataclass(frozen=True)
class RunSpec:
    """The columns of a run: `per_run` (one value per run), `per_row` (a list per run) and `constants`
    (the same value in every row of every run); any other column is null."""

    per_run: tuple[str, ...]
    per_row: tuple[str, ...]
    constants: dict[str, Any] = field(default_factory=dict)

    def entry(self, position: int, count: int, **values: Any) -> RunEntry:
        """A run of `count` rows after the table's first `position` buffered rows, its columns by name."""
        return (position, count, *(values[c] for c in self.per_run), *(values[c] for c in self.per_row))

    def batch(self, runs: list[RunEntry], schema: Any) -> Any:
        return runs_batch(self, runs, schema)


@dataclass(frozen=True)
class GridSpec:
    """Runs of steps by seats: entries `(position, count, first step, n, seat values, seat counts, sparse)`
    stand for `count` rows, step-major (row j * n + i: step `first step + j`, seat i). The `step` column
    counts the steps; `per_seat` repeats `seat values[i]` in every step; `counting` is `seat counts[i] + j`
    (a decode's computed tokens); `sparse` is an empty list but in the rows that `sparse` (a dict from
    row to list, rows in increasing order) names; `constants` and nulls as in RunSpec."""

    step: str
    per_seat: str
    counting: str
    sparse: str
    constants: dict[str, Any] = field(default_factory=dict)

    def batch(self, runs: list[RunEntry], schema: Any) -> Any:
        return grid_batch(self, runs, schema)


def grid_batch(spec: GridSpec, runs: list[RunEntry], schema: Any) -> Any:
    """The rows of `runs` (GridSpec entries) as one record batch of `schema`, built column by column in
    numpy: a row's run, step and seat come from its index."""
    import numpy as np
    import pyarrow as pa

    m = len(runs)
    counts = np.fromiter((r[1] for r in runs), np.int64, m)
    seats = np.fromiter((r[3] for r in runs), np.int64, m)
    first = np.fromiter((r[2] for r in runs), np.int64, m)
    run_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    seat_start = np.concatenate(([0], np.cumsum(seats)[:-1]))
    total = int(counts.sum())
    run = np.repeat(np.arange(m), counts)
    within = np.arange(total) - run_start[run]
    width = seats[run]
    j = within // width
    seat = seat_start[run] + within - j * width
    seat_counts = np.fromiter(chain.from_iterable(r[5] for r in runs), np.int64, int(seats.sum()))
    columns: dict[str, Any] = {spec.step: first[run] + j, spec.counting: seat_counts[seat] + j,
                               spec.sparse: _sparse_lists(runs, run_start, total)}
    values = pa.array(list(chain.from_iterable(r[4] for r in runs)), schema.field(spec.per_seat).type)
    columns[spec.per_seat] = values.take(pa.array(seat))
    return _record_batch(columns, spec.constants, total, schema)


def _sparse_lists(runs: list[RunEntry], run_start: Any, total: int) -> Any:
    """The sparse list column of grid runs: empty lists but in the rows each run's dict names."""
    import numpy as np
    import pyarrow as pa

    rows = np.fromiter(chain.from_iterable((s + k for k in r[6]) for r, s in zip(runs, run_start.tolist())), np.int64)
    lists = list(chain.from_iterable(r[6].values() for r in runs))
    lengths = np.zeros(total, np.int64)
    lengths[rows] = np.fromiter(map(len, lists), np.int64, len(lists))
    offsets = np.zeros(total + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(chain.from_iterable(lists), np.int64, int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def _record_batch(columns: dict[str, Any], constants: dict[str, Any], total: int, schema: Any) -> Any:
    """`columns` (Arrow or numpy arrays, lists) in the schema's order, `constants` repeated, every other
    column null."""
    import numpy as np
    import pyarrow as pa

    zeros = None
    arrays = []
    for f in schema:
        if f.name in columns:
            values = columns[f.name]
            if isinstance(values, pa.Array):
                arrays.append(values if values.type == f.type else values.cast(f.type))
            else:
                arrays.append(pa.array(values, f.type))
        elif constants.get(f.name) is not None:
            if zeros is None:
                zeros = pa.array(np.zeros(total, np.int32))
            arrays.append(pa.array([constants[f.name]], f.type).take(zeros))
        else:
            arrays.append(pa.nulls(total, f.type))
    return pa.record_batch(arrays, schema=schema)


def runs_batch(spec: RunSpec, runs: list[RunEntry], schema: Any) -> Any:
    """The rows of `runs` (entries as described above) as one record batch of `schema`."""
    import numpy as np

    counts = np.fromiter((r[1] for r in runs), np.int64, len(runs))
    total = int(counts.sum())
    columns: dict[str, Any] = {}
    for k, name in enumerate(spec.per_run, start=2):
        columns[name] = np.repeat(np.array([r[k] for r in runs]), counts)
    for k, name in enumerate(spec.per_row, start=2 + len(spec.per_run)):
        columns[name] = list(chain.from_iterable(r[k] for r in runs))
    return _record_batch(columns, spec.constants, total, schema)


def merge_runs(rows: Any | None, runs: Any, positions: list[int], counts: list[int]) -> Any:
    """Buffered rows (a record batch, or None) and a runs batch as one batch in recording order: run k
    goes after the first `positions[k]` buffered rows (positions never decrease)."""
    import numpy as np
    import pyarrow as pa

    if rows is None or not rows.num_rows:
        return runs
    pos = np.asarray(positions, np.int64)
    cnt = np.asarray(counts, np.int64)
    before = np.concatenate(([0], np.cumsum(cnt)))  # run rows ahead of each run
    n_rows, n_runs = rows.num_rows, int(before[-1])
    row_at = np.arange(n_rows) + before[np.searchsorted(pos, np.arange(n_rows), side="right")]
    run_at = np.repeat(pos, cnt) + np.arange(n_runs)
    order = np.empty(n_rows + n_runs, np.int64)
    order[np.concatenate((row_at, run_at))] = np.arange(n_rows + n_runs)
    return pa.concat_batches([rows, runs]).take(pa.array(order))
