"""The CPU decode-attention kernel in C (csrc/paged_decode.c), built once with the system compiler, for a
float32, bf16 or fp8 (e4m3fn) cache.

Torch has no op that reads a paged cache in place; the torch path (cpu_decode) strings together a
sparse sampled matmul, a padded softmax and embedding_bag, and each writes and re-reads its scores
through memory. The C kernel reads every cache row of a context once per pass, with the whole query
group scored against it, and threads over (sequence, kv heads) items in torch's own OpenMP pool.
How it is built, cached and turned off: engine/model_executor/native_build.py.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from engine.model_executor.native_build import cache_dir, compiler, enabled, load_library

__all__ = ["cache_dir", "compiler", "enabled", "load", "paged_decode", "supports"]

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
ABI_VERSION = 3
# The kernel's cache_kind for each cache dtype.
CACHE_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2}


@functools.cache
def load() -> Callable[..., int] | None:
    """The kernel's entry point, built on first use; None when it cannot be had here (see native_build)."""
    lib = load_library(SOURCE, "stepscope_paged_decode_abi", ABI_VERSION)
    if lib is None:
        return None
    fn = lib.stepscope_paged_decode
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, p, p, i32, p, i64, p, i32, i32, i32, i32, i32, i32, ctypes.c_float, p, i64, i32]
    fn.restype = i32
    return fn


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """A float32 or bf16 cache with queries of its dtype, or an fp8 one (queries of any dtype), on the CPU,
    and the kernel available."""
    return (kv_cache.device.type == "cpu" and kv_cache.dtype in CACHE_KINDS
            and (q.dtype == kv_cache.dtype or kv_cache.dtype == torch.float8_e4m3fn) and load() is not None)


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 scale: float, out: torch.Tensor) -> None:
    """Fill out [num_seqs, heads, d] with attention of q [num_seqs, heads, d] (one token per sequence)
    over each sequence's first seq_lens[i] cache positions, read through block_tables [>= num_seqs, W];
    in float32 throughout, a bf16 or fp8 cache's values widened as they are read."""
    fn = load()
    if fn is None:
        raise RuntimeError("native decode kernel: not available here; callers ask `supports` first")
    num_seqs, num_heads, head_size = q.shape
    _, _, block_size, num_kv_heads, cache_head_size = kv_cache.shape
    assert cache_head_size == head_size and num_heads % num_kv_heads == 0, (q.shape, kv_cache.shape)
    if num_seqs == 0:
        return
    if q.dtype != torch.float32:  # the kernel scores and sums in float32 whatever the cache holds
        q = q.float()
    if q.stride(2) != 1 or q.stride(1) != head_size:
        q = q.contiguous()
    assert out.shape == q.shape
    result = out
    if out.dtype != torch.float32 or out.stride(2) != 1 or out.stride(1) != head_size:
        out = torch.empty(q.shape, dtype=torch.float32)
    assert kv_cache.is_contiguous()
    tables = block_tables.to(torch.int32)
    if tables.stride(1) != 1:
        tables = tables.contiguous()
    lens = seq_lens[:num_seqs].to(torch.int32).contiguous()
    threads = torch.get_num_threads()
    # Whole sequences per item when there are enough to share out; else one kv head each, so a few long
    # contexts still keep every thread busy.
    per_item = num_kv_heads if num_seqs >= 4 * threads else 1
    rc = fn(q.data_ptr(), q.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
            CACHE_KINDS[kv_cache.dtype], tables.data_ptr(), tables.stride(0), lens.data_ptr(), num_seqs,
            num_heads, num_kv_heads, head_size, block_size, per_item, scale, out.data_ptr(), out.stride(0), threads)
    if rc != 0:
        raise MemoryError("native decode kernel: could not allocate its work buffer")
    if out is not result:
        result.copy_(out)
