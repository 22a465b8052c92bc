"""Decode attention on the CPU that reads the paged KV cache where it lies, without gathering it.

Gathering each sequence's blocks into a padded copy (index_select) and then running SDPA over the
copy moves the whole context three times through memory: read, write, read again. With a single
query token per sequence, attention is bound by that traffic. Here both products read the cache
in place, through one index list that every layer of a step shares:

- scores: a sparse sampled matmul, q . k only at (head row, cache row) pairs the block tables name;
- softmax: over the ragged rows of scores placed in a [rows, longest context] grid padded with -inf,
  one call for the step rather than one (and its views) per sequence;
- output: embedding_bag with the probabilities as per-sample weights, a weighted sum of V rows.

Only float32 caches take it: embedding_bag and the sampled matmul would accumulate a half-precision
cache in half precision.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class DecodeIndex:
    """Where each decode head's context lies in the cache viewed as [slots * kv_heads, head_size] rows.

    Rows of the score matrix are (sequence, head), sequence-major; row r holds the seq_len cache rows
    of its sequence's kv head. Built once per step (per head layout) and shared by every layer.
    """

    num_heads: int
    num_kv_heads: int
    crow: torch.Tensor       # int64 [num_decodes * num_heads + 1], row starts into `cols`
    cols: torch.Tensor       # int64 [num_heads * sum(seq_lens)], cache rows: slot * kv_heads + kv head
    zeros: torch.Tensor      # float32 [len(cols)]: the sampled matmul's (unused) input values
    grid_pos: torch.Tensor   # int64 [len(cols)]: each score's place in the [rows, max_len] softmax grid
    max_len: int             # the longest context: the grid's width


def supports(kv_cache: torch.Tensor) -> bool:
    return kv_cache.device.type == "cpu" and kv_cache.dtype == torch.float32


def build_decode_index(block_tables: torch.Tensor, seq_lens: list[int], block_size: int, num_heads: int,
                       num_kv_heads: int) -> DecodeIndex:
    """Cache rows of every (sequence, head, position) of the first len(seq_lens) sequences, vectorised."""
    num_seqs = len(seq_lens)
    group = num_heads // num_kv_heads
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    # Padded to the longest context: [seqs, max_len] slots, then one copy per head pointing at its kv
    # head, then the padding dropped. Cheaper than per-element divisions over the ragged layout.
    max_len = max(seq_lens)
    pos = torch.arange(max_len)
    table = block_tables[:num_seqs].to(torch.int64).index_select(1, pos // block_size)
    rows = (table * block_size + pos % block_size) * num_kv_heads  # [seqs, max_len]
    heads = torch.arange(num_heads) // group
    valid = (pos[None, :] < lens[:, None])[:, None, :].expand(num_seqs, num_heads, max_len)
    cols = (rows[:, None, :] + heads[None, :, None]).masked_select(valid)
    row_lens = lens.repeat_interleave(num_heads)
    crow = torch.zeros(num_seqs * num_heads + 1, dtype=torch.int64)
    torch.cumsum(row_lens, 0, out=crow[1:])
    # Score i of row r sits at grid place r * max_len + (i - crow[r]).
    row_shift = torch.arange(0, num_seqs * num_heads * max_len, max_len) - crow[:-1]
    grid_pos = torch.arange(cols.shape[0]) + row_shift.repeat_interleave(row_lens, output_size=cols.shape[0])
    return DecodeIndex(num_heads, num_kv_heads, crow, cols, torch.zeros(cols.shape[0]), grid_pos, max_len)


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, index: DecodeIndex, scale: float) -> torch.Tensor:
    """q [num_decodes, heads, d] (one token each) -> [num_decodes, heads, d], float32 throughout."""
    num_seqs, num_heads, head_size = q.shape
    rows = kv_cache[0].numel() // head_size
    keys = kv_cache[0].view(rows, head_size)
    values = kv_cache[1].view(rows, head_size)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the two ops used here are stable
        warnings.simplefilter("ignore", UserWarning)
        pattern = torch.sparse_csr_tensor(index.crow, index.cols, index.zeros, size=(num_seqs * num_heads, rows))
        scores = torch.sparse.sampled_addmm(pattern, q.reshape(num_seqs * num_heads, head_size), keys.t(),
                                            beta=0.0, alpha=scale).values()
    grid = scores.new_full((num_seqs * num_heads * index.max_len,), float("-inf"))
    grid.index_copy_(0, index.grid_pos, scores)
    probs = torch.softmax(grid.view(num_seqs * num_heads, index.max_len), dim=-1).view(-1).index_select(
        0, index.grid_pos)
    out = F.embedding_bag(index.cols, values, index.crow[:-1], mode="sum", per_sample_weights=probs)
    return out.view(num_seqs, num_heads, head_size)
