"""CUDA graphs for decode steps: one graph per padded batch size, captured at start-up, replayed with
the step's inputs copied into static buffers. A decode step of a small model is launch-bound, so
replaying the whole forward as one graph removes hundreds of kernel launches.

Capture uses worst-case host-side bounds (every sequence at max_model_len) so that any host value a
backend derives from the metadata (grid sizes, split counts) stays valid for every replay; the kernels
read the real lengths from device memory. Only backends without host syncs qualify (triton,
flash-attn); the torch reference backend runs eager.
"""
from __future__ import annotations

import torch

from engine.model_executor.forward_context import AttentionMetadata, set_forward_context

GRAPH_BACKENDS = ("triton", "flash-attn")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (at most 512)."""
    top = min(max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, 16))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, device: torch.device, max_num_seqs: int, max_model_len: int,
                 block_size: int) -> None:
        self.model = model
        self.device = device
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        top = self.sizes[-1]
        width = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((top, width), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _metadata(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_actual_tokens=bs, slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[:bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs], max_query_len=1,
            max_seq_len=self.max_model_len, num_decodes=bs, num_decode_tokens=bs,
            query_start_loc_cpu=list(range(bs + 1)), seq_lens_cpu=[self.max_model_len] * bs)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory pool
            meta = self._metadata(bs)
            with set_forward_context(meta):
                self.model(self.input_ids[:bs], self.positions[:bs])  # warm-up: compiles kernels
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self.model(self.input_ids[:bs], self.positions[:bs])
            pool = graph.pool()
            self.graphs[bs] = (graph, hidden)
        torch.cuda.synchronize(self.device)

    def can_run(self, num_tokens: int, all_decodes: bool) -> bool:
        return all_decodes and num_tokens <= self.sizes[-1] and bool(self.graphs)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            seq_lens: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
        """Replay the smallest graph that fits; padded rows write nothing and read the null block.
        The inputs are already on the device (input ids may come from the last step's sampled ids)."""
        n = len(input_ids)
        bs = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.seq_lens[n:bs].fill_(1)
        width = block_table.shape[1]
        self.block_tables[:n, :width].copy_(block_table, non_blocking=True)
        self.block_tables[:n, width:].zero_()
        self.block_tables[n:bs].zero_()
        graph, hidden = self.graphs[bs]
        graph.replay()
        return hidden[:n]
