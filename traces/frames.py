"""An Arrow table of one trace table as `traces.load` hands it out, whatever file it came from.

Two things keep a long trace's frames near the size of its data: rows beyond a cut-short trace's last step
are dropped in Arrow (a slice of the tail, as the rows are written in step order) before anything is
converted, instead of copying the converted frame; and a list column's empty rows are all one shared
empty array rather than an array object each (~110 bytes): nine decision rows in ten gain no block and
99 in 100 free none, so on a 200k-request replay that was ~3 GB of empty arrays for 29M list cells.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

# The tables whose rows belong to a step: a step's rows are written before its steps row, so a trace cut
# short can hold some beyond the last steps row, which readers drop.
STEP_ROW_TABLES = ("decisions", "block_events", "block_snapshots")


def list_cell(v: Any) -> Any:
    """A list cell (block ids, hashes, token ids) with a missing one as (): None from Parquet, pd.NA from
    an Arrow-backed column, NaN from a column pandas built."""
    if v is None or v is pd.NA or isinstance(v, float):
        return ()
    return v


def clip_rows(tbl: Any, last_step: int | None) -> Any:
    """`tbl` without its rows of steps after `last_step` (None keeps all): a zero-copy slice when they are
    the tail, as the writers leave them, else a filter."""
    import pyarrow.compute as pc

    if last_step is None or "step" not in tbl.column_names or not tbl.num_rows:
        return tbl
    keep = pc.fill_null(pc.less_equal(tbl["step"], last_step), False)
    n = pc.sum(keep).as_py() or 0
    if n == tbl.num_rows:
        return tbl
    if pc.all(keep.slice(0, n)).as_py():
        return tbl.slice(0, n)
    return tbl.filter(keep)


def clip_frame(df: pd.DataFrame, last_step: int | None) -> pd.DataFrame:
    """clip_rows for a frame read row by row (JSON lines the schema cannot type)."""
    if last_step is None or "step" not in df.columns or not len(df):
        return df
    keep = df["step"] <= last_step
    return df if keep.all() else df[keep].reset_index(drop=True)


def arrow_to_frame(tbl: Any, arrow_lists: bool = False) -> pd.DataFrame:
    """to_pandas freeing each Arrow column as it converts (the peak is one copy, not two) and keeping
    pandas' consolidated, writable blocks. List columns become pandas ArrowDtype columns with
    `arrow_lists`, else a read-only array per row (None for a null row) as to_pandas makes them, the
    empty ones one shared array."""
    names = tbl.column_names
    lists = [] if arrow_lists else [i for i, f in enumerate(tbl.schema) if _is_list(f.type)]
    columns = [(names[i], list_objects(tbl.column(i))) for i in lists]
    rest = tbl.drop_columns([names[i] for i in lists]) if lists else tbl
    del tbl
    df = rest.to_pandas(types_mapper=_arrow_list_dtype if arrow_lists else None, self_destruct=True)
    del rest
    for (name, values), at in zip(columns, lists):
        df.insert(at, name, values)
    return df


def list_objects(arr: Any) -> np.ndarray:
    """A list column (Arrow, chunked or not) as an object array of per-row arrays, the empty rows sharing
    one read-only empty array of the dtype to_pandas would give them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(arr), -1).to_numpy()
    out = np.empty(len(arr), dtype=object)
    empty = np.flatnonzero(lengths == 0)
    if not len(empty):  # no empty row to spare (token ids): the views straight over the column's values
        return arr.to_numpy(zero_copy_only=False)
    full = np.flatnonzero(lengths > 0)
    if len(full):
        out[full] = arr.filter(pa.array(lengths > 0)).to_numpy(zero_copy_only=False)
    if len(empty):
        shared = pa.array([[]], arr.type).to_numpy(zero_copy_only=False)[0]
        shared.flags.writeable = False
        holder = np.empty(1, dtype=object)
        holder[0] = shared
        out[empty] = holder
    return out


def table_to_frame(tbl: Any, columns: Sequence[str], only: Sequence[str] | None, categories: Sequence[str],
                   arrow_lists: bool, last_step: int | None = None) -> pd.DataFrame:
    """A streamed table as the reader hands it out: schema columns first, then extra ones, only `only`
    when given, rows beyond `last_step` dropped, `categories` dictionary-encoded."""
    names = [*columns, *(c for c in tbl.column_names if c not in columns)]
    if only is not None:
        names = [c for c in names if c in set(only)]
    tbl = clip_rows(tbl.select(names), last_step)
    for c in categories:
        if c in names:
            tbl = tbl.set_column(names.index(c), c, tbl[c].dictionary_encode())
    return arrow_to_frame(tbl, arrow_lists)


def _is_list(ty: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(ty) or pa.types.is_large_list(ty)


def _arrow_list_dtype(ty: Any) -> Any:
    return pd.ArrowDtype(ty) if _is_list(ty) else None
