"""The attention layer a model holds: it owns the binding to its KV cache and defers to a backend."""
from __future__ import annotations

import torch
from torch import nn

from engine.model_executor.attention.abstract import AttentionBackend
from engine.model_executor.attention.torch_backend import TorchAttentionBackend
from engine.model_executor.forward_context import get_forward_context


class Attention(nn.Module):
    """Paged attention over this layer's `kv_cache`, which the runner binds after allocating it.

    Step metadata comes from the forward context, so the model forward stays (input_ids, positions).
    The layer starts on the torch reference backend; the runner binds the chosen one (`backend_name`)
    together with the cache, once block size and dtype are known.
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        backend: str = "auto",
        layer_idx: int = 0,
    ) -> None:
        super().__init__()
        assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.layer_idx = layer_idx
        self.backend_name = backend
        self.backend: type[AttentionBackend] = TorchAttentionBackend
        self.kv_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, nh*d], k/v [T, kvh*d] -> [T, nh*d]."""
        num_tokens = q.shape[0]
        out = self.backend.forward(
            q.view(num_tokens, self.num_heads, self.head_size),
            k.view(num_tokens, self.num_kv_heads, self.head_size),
            v.view(num_tokens, self.num_kv_heads, self.head_size),
            self.kv_cache,
            get_forward_context().attn_metadata,
            self.scale,
        )
        return out.reshape(num_tokens, self.num_heads * self.head_size)
