"""Row runs: many rows of a table handed over as a few lists, turned into Arrow without a Python value
per cell.

Most steps of a long run are all decodes, and each decode's decision row differs from the next only in
its request, computed count and new block ids; the rest (the step, `schedule`, 1 token, `decode`, no
hit, nothing freed) is the same for the whole step. A batched writer (`TraceWriter.run_buffer`) takes
such a step as one entry `(position, count, *per_run, *per_row)`: `position` is how many of the table's
buffered rows come before it, `per_run` values are repeated `count` times, `per_row` values are lists
of `count`. At each flush the runs become one record batch, built column by column in C, and are merged
into the buffered rows at their positions, so the stream holds exactly the rows the buffer alone would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    """The columns of a run: `per_run` (one value per run), `per_row` (a list per run) and `constants`
    (the same value in every row of every run); any other column is null."""

    per_run: tuple[str, ...]
    per_row: tuple[str, ...]
    constants: dict[str, Any] = field(default_factory=dict)


def runs_batch(spec: RunSpec, runs: list[tuple], schema: Any) -> Any:
    """The rows of `runs` (entries as described above) as one record batch of `schema`."""
    import numpy as np
    import pyarrow as pa

    counts = np.fromiter((r[1] for r in runs), np.int64, len(runs))
    total = int(counts.sum())
    columns: dict[str, Any] = {}
    for k, name in enumerate(spec.per_run, start=2):
        columns[name] = np.repeat(np.array([r[k] for r in runs]), counts)
    for k, name in enumerate(spec.per_row, start=2 + len(spec.per_run)):
        columns[name] = list(chain.from_iterable(r[k] for r in runs))
    zeros = None
    arrays = []
    for f in schema:
        if f.name in columns:
            arrays.append(pa.array(columns[f.name], f.type))
        elif spec.constants.get(f.name) is not None:
            if zeros is None:
                zeros = pa.array(np.zeros(total, np.int32))
            arrays.append(pa.array([spec.constants[f.name]], f.type).take(zeros))
        else:
            arrays.append(pa.nulls(total, f.type))
    return pa.record_batch(arrays, schema=schema)


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
