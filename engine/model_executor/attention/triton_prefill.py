"""Triton prefill / chunked-prefill attention that reads the whole context through the block table.

A sequence's q_len queries sit at positions seq_len - q_len .. seq_len - 1, so one kernel covers
fresh prompts, chunks after earlier chunks and chunks after a prefix-cache hit: the new K/V are
stored first and every query attends causally to cache positions 0..its own. One program takes a
tile of queries of one sequence for all query heads of one kv head (rows = token x head in group),
so those heads share each K/V tile; softmax is online in fp32 with exp2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model_executor.attention.triton_decode import LOG2E, attend_tile, dot_config

BLOCK_M = 64   # rows per program: query tokens x query heads of the kv group
TILE_N = 64    # context tokens per inner step


@triton.jit
def _prefill_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, query_start_ptr, out_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_c_kv, stride_c_blk, stride_c_pos, stride_c_h, stride_bt,
    qk_scale, group, first_seq,
    BLOCK_SIZE: tl.constexpr, HEAD_D: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    TILE: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = first_seq + tl.program_id(0)
    kv_head = tl.program_id(1)
    tile_q = tl.program_id(2) * BLOCK_Q
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if tile_q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = tile_q + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    heads = kv_head * group + head_in_group
    row_ok = (tok < q_len) & (head_in_group < group)
    dims = tl.arange(0, HEAD_D)
    row = (q_start + tok).to(tl.int64)  # flat token index; large batches overflow int32 offsets
    q_off = row[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
    q_pos = context_len + tok

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_D], tl.float32)
    table = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = cache_ptr + kv_head * stride_c_h
    # keys past the tile's last query are masked for every row; position 0 is visible to all
    # rows (padding rows included), so no row ever sees an all -inf tile first
    kv_end = tl.minimum(seq_len, context_len + tile_q + BLOCK_Q)
    for tile_start in range(0, kv_end, TILE):
        pos = tile_start + tl.arange(0, TILE)
        valid = pos < kv_end
        visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
        m_i, l_i, acc = attend_tile(q, table, k_base, pos, valid, visible, dims, m_i, l_i, acc, qk_scale,
                                    stride_c_kv, stride_c_blk, stride_c_pos, BLOCK_SIZE, DOT_DTYPE, DOT_PRECISION)

    out = acc / l_i[:, None]
    o_off = row[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    first_seq: int,
    num_seqs: int,
    max_query_len: int,
    scale: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """Sequences first_seq .. first_seq+num_seqs-1 of the batch: their rows of q [T, nh, d] (located by
    query_start_loc) attend causally to their cached context; results go to the same rows of out.

    `max_query_len` is a host-side upper bound on their query lengths, used only to size the grid.
    """
    _, num_heads, head_size = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_seqs == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, BLOCK_M // group_pad)
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _prefill_kernel[grid](
        q, kv_cache, block_tables, seq_lens, query_start_loc, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        scale * LOG2E, group, first_seq,
        BLOCK_SIZE=block_size, HEAD_D=head_size, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        TILE=TILE_N, **dot_config(q.dtype),
    )
    return out
