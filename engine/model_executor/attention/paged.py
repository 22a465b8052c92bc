"""The steps every paged kernel backend (Triton, flash-attn) shares around its kernels: without metadata or
a cache (profiling, warm-up) the torch reference answers; padding rows past the step's tokens come back
zero; this step's K/V are stored first; then decodes (query length 1, ordered first by the runner) and
prefill chunks each go to the backend's own kernel."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.model_executor.attention import torch_backend
from engine.model_executor.attention.abstract import AttentionForward, KVStore
from engine.model_executor.forward_context import AttentionMetadata

# (q, kv_cache, meta, scale, out, num_decodes) -> None: fills its rows of `out`.
Kernel = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, float, torch.Tensor, int], None]
# (q, kv_cache) -> None: raises where the backend cannot take these inputs.
Check = Callable[[torch.Tensor, torch.Tensor], None]


def paged_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                  meta: AttentionMetadata | None, scale: float, *, store: KVStore, decode: Kernel,
                  prefill: Kernel, check: Check | None = None) -> torch.Tensor:
    """The backend contract of torch_backend.forward, with the kernels plugged in."""
    if meta is None or kv_cache is None:
        return torch_backend.forward(q, k, v, kv_cache, meta, scale)
    if check is not None:
        check(q, kv_cache)
    n = meta.num_actual_tokens
    out = torch.empty_like(q)
    out[n:].zero_()
    store(k[:n], v[:n], kv_cache, meta.slot_mapping[:n])
    nd = meta.num_decodes
    if nd:
        assert meta.num_decode_tokens == nd, "decode sequences must have query length 1"
        decode(q, kv_cache, meta, scale, out, nd)
    if meta.num_seqs > nd:
        prefill(q, kv_cache, meta, scale, out, nd)
    return out


def paged_backend_forward(*, store: KVStore, decode: Kernel, prefill: Kernel,
                          check: Check | None = None) -> AttentionForward:
    """A backend's `forward`: `paged_forward` with its kernels bound."""
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                meta: AttentionMetadata | None, scale: float) -> torch.Tensor:
        return paged_forward(q, k, v, kv_cache, meta, scale, store=store, decode=decode, prefill=prefill, check=check)

    return forward
