"""Triton paged decode attention (one query token per sequence) with split-K over long contexts.

One program handles one (sequence, kv head, split): the query heads of that kv group are packed
as rows of one tile so they share every K/V load (GQA). A long context is cut into splits so a
small batch still fills the GPU; each split keeps its own running max / sum / accumulator and a
second kernel merges them. Softmax runs in fp32 with exp2 (scores are pre-scaled by log2 e).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

LOG2E = 1.4426950408889634
MIN_GROUP_ROWS = 16   # tl.dot needs at least 16 rows, so small groups are padded
TILE_N = 32           # context tokens per inner step; any size works, pages are gathered per token
MIN_SPLIT_LEN = 256   # do not split contexts finer than this
MAX_SPLITS = 32


@triton.jit
def attend_tile(q, table, k_base, pos, valid, visible, dims, m_i, l_i, acc, qk_scale,
                stride_c_kv, stride_c_blk, stride_c_pos, BLOCK_SIZE: tl.constexpr,
                DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One context tile of online softmax, shared by decode and prefill: gather the tile's K/V
    through the block table, score (log2 units), mask to `visible`, rescale the running max, sum and
    accumulator, add p @ V. Returns the new (max, sum, accumulator)."""
    block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    offs = block * stride_c_blk + (pos % BLOCK_SIZE) * stride_c_pos
    k = tl.load(k_base + offs[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
    v = tl.load(k_base + stride_c_kv + offs[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k).to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_c_kv, stride_c_blk, stride_c_pos, stride_c_h, stride_bt,
    qk_scale, group, split_len,
    BLOCK_SIZE: tl.constexpr, HEAD_D: tl.constexpr, GROUP_PAD: tl.constexpr, TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_D)
    heads = kv_head * group + rows
    row_ok = rows < group
    q_off = seq * stride_qt + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_D], tl.float32)
    table = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = cache_ptr + kv_head * stride_c_h
    for tile_start in range(start, end, TILE):
        pos = tile_start + tl.arange(0, TILE)
        valid = pos < end
        m_i, l_i, acc = attend_tile(q, table, k_base, pos, valid, valid[None, :], dims, m_i, l_i, acc, qk_scale,
                                    stride_c_kv, stride_c_blk, stride_c_pos, BLOCK_SIZE, DOT_DTYPE, DOT_PRECISION)

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        dst = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        # partials are laid out [seq, q_head, split, ...]; an empty split leaves m=-inf, l=0, acc=0
        part = (seq * num_kv_heads * group + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_D + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _reduce_splits_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh,
    HEAD_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + tl.arange(0, NUM_SPLITS)
    m = tl.load(part_ml_ptr + part * 2)
    l = tl.load(part_ml_ptr + part * 2 + 1)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_D + tl.arange(0, HEAD_D)[None, :])
    weight = tl.exp2(m - tl.max(m, axis=0))  # split 0 is never empty, so the max is finite
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + tl.arange(0, HEAD_D), out.to(out_ptr.dtype.element_ty))


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def kernels_interpreted() -> bool:
    """True when the kernels were built by Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return isinstance(_decode_kernel, InterpretedFunction)


def dot_config(dtype: torch.dtype) -> dict:
    """Operand type and precision of the kernels' two matmuls for inputs of `dtype`.

    fp32 stays exact ("ieee"; the default would round to tf32). bf16 is upcast only under the
    CPU interpreter, whose tl.dot multiplies bf16's raw uint16 storage (seen with triton 3.9).
    """
    if dtype == torch.float32 or (dtype == torch.bfloat16 and kernels_interpreted()):
        return {"DOT_DTYPE": tl.float32, "DOT_PRECISION": "ieee"}
    return {"DOT_DTYPE": _TL_DTYPES[dtype], "DOT_PRECISION": None}


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Split only when the (sequence, kv head) programs alone would leave SMs idle; never below MIN_SPLIT_LEN."""
    programs = num_seqs * num_kv_heads
    wanted = -(-2 * _num_sms(device) // max(programs, 1))
    by_length = -(-max_seq_len // MIN_SPLIT_LEN)
    splits = max(1, min(wanted, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)  # round down: the reduce kernel needs a power of two


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q [B, nh, d] (one token per sequence) attends to its seq_lens[b] cached tokens; writes out [B, nh, d].

    `max_seq_len` is a host-side bound used only to size the split grid; `num_splits` (a power
    of two) overrides the heuristic, which tests use to force split-K on short contexts.
    """
    num_seqs, num_heads, head_size = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, q.device)
    assert num_splits == triton.next_power_of_2(num_splits), f"num_splits must be a power of two, got {num_splits}"
    split_len = -(-max(max_seq_len, 1) // num_splits)
    split_len = -(-split_len // TILE_N) * TILE_N
    if num_splits > 1:
        part_acc = torch.empty(num_seqs * num_heads * num_splits, head_size, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_seqs * num_heads * num_splits, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused by the single-split variant
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, kv_cache, block_tables, seq_lens, out, part_acc, part_ml,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        scale * LOG2E, group, split_len,
        BLOCK_SIZE=block_size, HEAD_D=head_size, GROUP_PAD=max(MIN_GROUP_ROWS, triton.next_power_of_2(group)),
        TILE=TILE_N, NUM_SPLITS=num_splits, **dot_config(q.dtype),
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, out, out.stride(0), out.stride(1), HEAD_D=head_size, NUM_SPLITS=num_splits
        )
    return out
