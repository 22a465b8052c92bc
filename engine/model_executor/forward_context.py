"""Per-step state that attention layers read without it passing through the model's forward.

Keeping the model signature at `(input_ids, positions)` is what lets a runner capture CUDA graphs
later: everything step-specific (slots, block tables, lengths) travels here instead.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Iterator, Sequence

import torch


@dataclass(slots=True)
class AttentionMetadata:
    num_actual_tokens: int            # real tokens in the flattened batch (the rest is padding)
    slot_mapping: torch.Tensor        # int64 [T]; slot = block_id*block_size + offset; -1 = padding
    query_start_loc: torch.Tensor     # int32 [B+1] on device, cumulative query lengths
    seq_lens: torch.Tensor            # int32 [B] on device: context length after this step
    block_tables: torch.Tensor        # int32 [B, max_blocks_per_seq] on device (unused entries 0)
    max_query_len: int
    max_seq_len: int
    num_decodes: int                  # the first num_decodes sequences each have query length 1
    num_decode_tokens: int
    query_start_loc_cpu: list[int]    # host copy of query_start_loc, for per-sequence loops
    seq_lens_cpu: list[int]
    # Derived once per step by the backend that needs it (the CPU decode index), then read by every layer.
    decode_index: object | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


@dataclass(slots=True)
class ForwardContext:
    attn_metadata: AttentionMetadata | None = None


_EMPTY = ForwardContext()
_forward_context: ForwardContext = _EMPTY


def get_forward_context() -> ForwardContext:
    """The context of the step being run; its attn_metadata is None outside set_forward_context."""
    return _forward_context


@contextmanager
def set_forward_context(attn_metadata: AttentionMetadata | None) -> Iterator[ForwardContext]:
    """Make `attn_metadata` visible to every attention layer for the duration of one forward."""
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(attn_metadata)
    try:
        yield _forward_context
    finally:
        _forward_context = prev


def build_attn_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str,
    num_padding: int = 0,
) -> AttentionMetadata:
    """Build metadata from plain lists (decodes must come first); for tests, profiling and simple runners.

    Each sequence's query tokens sit at positions seq_len - query_len .. seq_len - 1, so their
    slots are read from that range of the block table. `num_padding` appends -1 slots.
    """
    assert len(query_lens) == len(seq_lens) == len(block_tables)
    num_decodes = 0
    while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
        num_decodes += 1
    qsl = [0]
    slots: list[int] = []
    for q, s, bt in zip(query_lens, seq_lens, block_tables):
        assert 0 < q <= s and len(bt) * block_size >= s, (q, s, len(bt))
        qsl.append(qsl[-1] + q)
        slots.extend(bt[p // block_size] * block_size + p % block_size for p in range(s - q, s))
    slots.extend([-1] * num_padding)
    width = max((len(bt) for bt in block_tables), default=0)
    table = [list(bt) + [0] * (width - len(bt)) for bt in block_tables]
    return AttentionMetadata(
        num_actual_tokens=qsl[-1],
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        block_tables=torch.tensor(table, dtype=torch.int32, device=device).reshape(len(table), width),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        num_decodes=num_decodes,
        num_decode_tokens=num_decodes,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
    )
