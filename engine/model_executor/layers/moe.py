"""Sparse Mixture-of-Experts feed-forward block: a router picks `top_k` SwiGLU experts per token.

The experts' weights are stacked, one tensor for all gate/up projections ([E, 2 * I, H], gate rows then up
rows, as the dense MLP's merged gate_up_proj) and one for all down projections ([E, H, I]), so a loader
fills expert `e`'s checkpoint tensors into row block `e`. On CUDA (with Triton) the experts run as two
grouped GEMMs over the tokens sorted by expert (fused_moe.py), which never reads back to the host and so
also runs under CUDA graph capture. Elsewhere the forward is a torch reference: each expert that some token
chose runs once on the tokens that chose it, and its weighted output is added into theirs. Picking those
experts reads the routing back to the host, which a capture forbids; capturing without Triton, every
expert runs on every token instead, weighted by zero where the token did not choose it.

Each block also counts, on the device, how many tokens each expert received in its last forward
(`expert_counts`); the model runner turns them into the step's routing counters (`routing_counters`).
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.model_executor.forward_context import get_forward_context
from engine.model_executor.layers.activation import SiluAndMul

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (float32 weights [T, top_k], expert ids [T, top_k]): softmax in float32 over
    all experts, the top_k largest kept and, with `renormalize`, rescaled to sum to one per token."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_path_usable(x: torch.Tensor) -> bool:
    """The Triton path runs on CUDA; on a CPU only where its kernels were built by Triton's interpreter
    (TRITON_INTERPRET=1, for tests), as the Triton attention backend does."""
    if not _HAS_TRITON:
        return False
    if x.is_cuda:
        return True
    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
        return False
    from engine.model_executor.layers import fused_moe

    return fused_moe.kernels_interpreted()


def routing_counters(blocks: Sequence[SparseMoeBlock]) -> torch.Tensor:
    """int64 [3] on the blocks' device, from their last forward: the most distinct experts one layer
    activated, the distinct experts summed over the layers (a mean once divided on the host), and the most
    tokens any one expert received in any layer. Layers are pooled rather than listed because a cost model
    prices every MoE layer from the same table: the mean is what the sum of their times depends on, the
    max shows the most spread layer, and the busiest expert bounds the slowest one."""
    counts = torch.stack([b.expert_counts for b in blocks])
    active = (counts > 0).sum(dim=1)
    return torch.stack((active.max(), active.sum(), counts.max()))


class SparseMoeBlock(nn.Module):
    """[T, H] -> [T, H]: sum over a token's top_k experts of routing weight * SwiGLU expert(x).

    `weights_in_hidden_dtype` casts the routing weights to the activations' dtype before they scale the
    expert outputs (Qwen3-MoE); otherwise the product is taken in float32 and then cast (Mixtral). The
    two agree in float32 and differ only in rounding for bf16/fp16.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        weights_in_hidden_dtype: bool,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{num_experts} (num_experts), not {top_k}")
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.weights_in_hidden_dtype = weights_in_hidden_dtype
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # the router
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act_fn = SiluAndMul()
        # Tokens each expert received in the last forward; a fixed buffer, so CUDA graph replays refresh it.
        self.expert_counts: torch.Tensor
        self.register_buffer("expert_counts", torch.zeros(num_experts, dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        if self.weights_in_hidden_dtype:
            weights = weights.to(x.dtype)
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        self._count(ids, capturing)
        if fused_path_usable(x):
            from engine.model_executor.layers import fused_moe

            return fused_moe.fused_experts(x, self.w13_weight, self.w2_weight, weights, ids)
        if capturing:
            return self.forward_all_experts(x, weights, ids)
        return self.forward_reference(x, weights, ids)

    def forward_reference(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The torch reference: experts in ascending order, each on the (token, slot) pairs that chose it."""
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            tokens, slots = torch.nonzero(ids == expert, as_tuple=True)
            h = self.act_fn(F.linear(x[tokens], self.w13_weight[expert]))
            h = F.linear(h, self.w2_weight[expert]) * weights[tokens, slots, None]
            out.index_add_(0, tokens, h.to(out.dtype))
        return out

    def _count(self, ids: torch.Tensor, capturing: bool) -> None:
        """Tokens per expert into `expert_counts`, on the device. A scatter-add, not torch.bincount, which on
        CUDA reads the largest id back to size its output. A captured graph is replayed on batches padded
        to its size, so there the padding rows (slot -1 in the step's metadata) count for nothing."""
        src = torch.ones_like(ids)
        meta = get_forward_context().attn_metadata
        if capturing and meta is not None and meta.slot_mapping.shape[0] == ids.shape[0]:
            src = (meta.slot_mapping >= 0).to(ids.dtype)[:, None].expand_as(ids)
        self.expert_counts.zero_().scatter_add_(0, ids.reshape(-1), src.reshape(-1))

    def forward_all_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The same sum without host syncs (for CUDA graphs): each expert on all tokens, scaled by the
        token's weight for it, zero where the token did not choose it; num_experts / top_k times the work."""
        combine = torch.zeros(x.shape[0], self.num_experts, dtype=weights.dtype, device=x.device)
        combine.scatter_(1, ids, weights)
        out = torch.zeros_like(x)
        for expert in range(self.num_experts):
            h = self.act_fn(F.linear(x, self.w13_weight[expert]))
            out += (F.linear(h, self.w2_weight[expert]) * combine[:, expert, None]).to(out.dtype)
        return out
