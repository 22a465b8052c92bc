"""The runner's own view of each request, updated from the scheduler's diffs, and the flattened batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.core.sampling_params import SamplingParams


@dataclass(slots=True)
class CachedRequestState:
    """What the runner remembers between steps, so the scheduler only has to send what changed."""

    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None
    generator: torch.Generator | None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(slots=True)
class BatchInputs:
    """Host-side arrays of one flattened step: decodes first, then prefill chunks."""

    req_ids: list[str]
    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_lens: list[int]
    seq_lens: list[int]
    block_table: np.ndarray
    num_decodes: int
    sample_rows: list[int]


def build_batch(states: list[CachedRequestState], query_lens: list[int], block_size: int) -> BatchInputs:
    """Flatten the step's requests into token, position and slot arrays (ordered as given)."""
    n = len(states)
    total = sum(query_lens)
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    seq_lens = [0] * n
    width = max(len(s.block_ids) for s in states)
    block_table = np.zeros((n, width), dtype=np.int32)
    sample_rows: list[int] = []
    offset = 0
    num_decodes = 0
    for i, (st, q) in enumerate(zip(states, query_lens)):
        start = st.num_computed_tokens
        end = start + q
        if q == 1:
            input_ids[offset] = st.token_ids[start]
            positions[offset] = start
            if i == num_decodes:
                num_decodes += 1
        else:
            input_ids[offset:offset + q] = st.token_ids[start:end]
            positions[offset:offset + q] = np.arange(start, end)
        block_table[i, :len(st.block_ids)] = st.block_ids
        seq_lens[i] = end
        if end >= len(st.token_ids):
            sample_rows.append(i)
        offset += q
    rows = np.repeat(np.arange(n), query_lens)
    slot_mapping = block_table[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return BatchInputs([s.req_id for s in states], input_ids, positions, slot_mapping, list(query_lens), seq_lens,
                       block_table, num_decodes, sample_rows)
