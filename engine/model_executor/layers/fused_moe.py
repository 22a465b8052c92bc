"""Fused Mixture-of-Experts on Triton: every expert's tokens in one grouped GEMM launch per projection.

A token's top_k (token, slot) pairs are sorted by expert and each expert's run is padded to a whole number
of row blocks (`align_by_expert`), so a program of the grouped GEMM multiplies one block of rows by a
single expert's weights. gate_up (w13) writes each pair's row, SiluAndMul halves it, down (w2) scales each
row by its routing weight, and the top_k rows of a token are summed. Nothing reads back to the host (the
grid is sized from shapes alone), so the path runs under CUDA graph capture too.

Kernels are reached through this module (not imported by name) so a test that reloads it under
TRITON_INTERPRET=1 is picked up by `SparseMoeBlock` too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from engine.model_executor.layers.activation import SiluAndMul


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weight_ptr, sorted_pairs_ptr, block_expert_ptr,
    N, K, num_pairs,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    ROWS_PER_A: tl.constexpr, SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """C[pair, n] = A[pair // ROWS_PER_A, :] . B[expert, n, :] (times weight[pair] with SCALE) for the
    BLOCK_M sorted pairs of program 0's block, all routed to that block's expert; padding rows write nothing."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:  # a block past the last expert's run
        return
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = (pairs // ROWS_PER_A).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALE:
        w = tl.load(weight_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def kernels_interpreted() -> bool:
    """True when the kernels were built by Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return isinstance(_grouped_gemm_kernel, InterpretedFunction)


def _dot_config(dtype: torch.dtype) -> tuple[tl.dtype, str | None]:
    """fp32 stays exact ("ieee", not tf32); the interpreter's tl.dot mishandles bf16, so it upcasts there."""
    if dtype == torch.float32 or (dtype == torch.bfloat16 and kernels_interpreted()):
        return tl.float32, "ieee"
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype], None


def block_rows(num_pairs: int, num_experts: int) -> int:
    """Rows per GEMM block: small for decode batches (most experts get a token or two), larger as each
    expert's share grows, so padding stays a fraction of the work."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, top_k] -> (sorted pairs int32 [capacity], expert per block int32 [capacity / block_m]).

    Pair p = token * top_k + slot. Each expert's pairs follow in token order from a block boundary, with
    `T * top_k` (no pair) filling its last block; blocks after the last expert's say -1. The capacity is the
    worst case for the shapes, so no count is read back to size it."""
    flat = ids.reshape(-1)
    num_pairs, dev = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(num_pairs, device=dev) - (counts.cumsum(0) - counts)[experts]  # place within its expert
    capacity = -(-(num_pairs + min(num_pairs, num_experts) * (block_m - 1)) // block_m) * block_m
    sorted_pairs = torch.full((capacity,), num_pairs, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, (ends - padded)[experts] + rank, order.to(torch.int32))
    block_starts = torch.arange(0, capacity, block_m, device=dev)
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    return sorted_pairs, torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)


def _grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, weights: torch.Tensor,
                  sorted_pairs: torch.Tensor, block_expert: torch.Tensor, rows_per_a: int, scale: bool,
                  block_m: int) -> None:
    n, k = b.shape[1], b.shape[2]
    block_n = 64
    block_k = 32 if a.dtype == torch.float32 else 64
    dot_dtype, precision = _dot_config(a.dtype)
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, b, out, weights, sorted_pairs, block_expert, n, k, weights.numel(),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        ROWS_PER_A=rows_per_a, SCALE=scale, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
    )


_ACT = SiluAndMul()


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                  ids: torch.Tensor) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I], routing weights and expert ids [T, top_k] -> [T, H]: the
    sum over each token's experts of weight * down(silu(gate) * up), the product taken in float32 and
    rounded once to x's dtype (weights already in x's dtype keep that rounding)."""
    num_tokens, top_k = ids.shape
    num_experts, hidden = w13.shape[0], x.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(x)
    num_pairs = num_tokens * top_k
    block_m = block_rows(num_pairs, num_experts)
    sorted_pairs, block_expert = align_by_expert(ids, num_experts, block_m)
    flat_weights = weights.reshape(-1).contiguous()
    gate_up = torch.empty(num_pairs, w13.shape[1], dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w13, gate_up, flat_weights, sorted_pairs, block_expert, top_k, False, block_m)
    h = _ACT(gate_up)
    down = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm(h, w2, down, flat_weights, sorted_pairs, block_expert, 1, True, block_m)
    return down.view(num_tokens, top_k, hidden).sum(dim=1)
