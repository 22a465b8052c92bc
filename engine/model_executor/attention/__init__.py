"""Attention backend selection; every backend shares the (2, blocks, block_size, kv_heads, head_size) cache layout."""
from __future__ import annotations

import torch

from engine.model_executor.attention.torch_backend import TorchAttentionBackend

# Names that will get their own backend module; listed so a request for them fails clearly until then.
_PLANNED = ("triton", "flash-attn")


def get_attn_backend(name: str, device: torch.device | str) -> type[TorchAttentionBackend]:
    """Resolve a backend name ("auto", "torch") for `device`; "auto" picks the best one available there."""
    if name == "auto":
        # Once the triton / flash-attn backends exist, CUDA devices will prefer them here.
        name = "torch"
    if name == "torch":
        return TorchAttentionBackend
    if name in _PLANNED:
        raise NotImplementedError(f"attention backend {name!r} is not implemented yet; use 'torch' or 'auto'")
    raise ValueError(f"unknown attention backend {name!r}; valid: 'auto', 'torch'")
