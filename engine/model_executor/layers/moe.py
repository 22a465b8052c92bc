"""Sparse Mixture-of-Experts feed-forward block: a router picks `top_k` SwiGLU experts per token.

The experts' weights are stacked, one tensor for all gate/up projections ([E, 2 * I, H], gate rows then up
rows, as the dense MLP's merged gate_up_proj) and one for all down projections ([E, H, I]), so a loader
fills expert `e`'s checkpoint tensors into row block `e`. The forward is a torch reference: each expert
that some token chose runs once on the tokens that chose it, and its weighted output is added into theirs.
Picking those experts reads the routing back to the host, which a CUDA graph capture forbids; while one is
capturing, every expert runs on every token instead, weighted by zero where the token did not choose it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model_executor.layers.activation import SiluAndMul


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        if self.weights_in_hidden_dtype:
            weights = weights.to(x.dtype)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.forward_all_experts(x, weights, ids)
        out = torch.zeros_like(x)
        # experts in ascending order, each on the (token, slot) pairs that chose it
        for expert in ids.unique().tolist():
            tokens, slots = torch.nonzero(ids == expert, as_tuple=True)
            h = self.act_fn(F.linear(x[tokens], self.w13_weight[expert]))
            h = F.linear(h, self.w2_weight[expert]) * weights[tokens, slots, None]
            out.index_add_(0, tokens, h.to(out.dtype))
        return out

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
