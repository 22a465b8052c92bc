"""The attention backend interface (vLLM's AttentionBackend): a class of static methods that the
attention layer and the model runner call, and the paged cache layout that every backend shares."""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

import torch

from engine.model_executor.forward_context import AttentionMetadata


class AttentionForward(Protocol):
    """A backend's `forward`, as a value (paged.paged_backend_forward makes them)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                 meta: AttentionMetadata | None, scale: float) -> torch.Tensor: ...


# (key [T, kvh, d], value [T, kvh, d], kv_cache, slot_mapping [T]) -> None: writes this step's K/V.
KVStore = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


class AttentionBackend:
    """Subclasses set `name` and their two kernel entry points; the cache layout is everyone's."""

    name: ClassVar[str]

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """(2, num_blocks, block_size, kv_heads, head_size): K then V, each split into blocks of slots."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
        """Scatter this step's K/V [T, kvh, d] into their cache slots; slot -1 marks padding and is skipped."""
        raise NotImplementedError

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                meta: AttentionMetadata | None, scale: float) -> torch.Tensor:
        """q [T, nh, d], k/v [T, kvh, d] -> [T, nh, d] (torch_backend.forward states the contract)."""
        raise NotImplementedError
