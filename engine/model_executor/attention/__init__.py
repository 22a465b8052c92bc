"""Attention backend selection; every backend shares the (2, blocks, block_size, kv_heads, head_size) cache layout.

Triton and flash-attn modules are imported only when chosen, so torch-only runs never load them
and a test can set TRITON_INTERPRET=1 before the Triton kernels are defined.
"""
from __future__ import annotations

import importlib.util
import os

import torch

from engine.model_executor.attention.abstract import AttentionBackend
from engine.model_executor.attention.torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionBackendUnavailableError", "BACKEND_NAMES", "get_attn_backend"]

BACKEND_NAMES = ("auto", "torch", "triton", "flash-attn")


class AttentionBackendUnavailableError(NotImplementedError, ValueError):
    """A known backend that cannot run here (missing package, wrong device, unmet constraint).

    It subclasses NotImplementedError, what asking for a not-yet-built backend raised before, and
    ValueError, so the command line ends with its one line like any other bad flag.
    """


def _triton_unavailable_reason(device: torch.device, head_size: int | None,
                               dtype: torch.dtype | None = None) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if head_size is not None and (head_size < 16 or head_size & (head_size - 1)):
        return f"the triton backend needs a power-of-two head size >= 16, got {head_size}"
    if device.type == "cuda":
        if dtype == torch.float8_e4m3fn and torch.cuda.get_device_capability(device) < (8, 9):
            return "triton converts an fp8 KV cache only on GPUs of compute capability 8.9 or newer"
        return None
    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("1", "true", "on", "yes"):
        return f"the triton backend runs on CUDA; on {device.type} it needs TRITON_INTERPRET=1 (tests only)"
    from engine.model_executor.attention import triton_backend

    if not triton_backend.kernels_interpreted():
        return "the triton kernels were imported before TRITON_INTERPRET=1 was set; set it before importing them"
    return None


def _flash_attn_unavailable_reason(
    device: torch.device, block_size: int | None, dtype: torch.dtype | None, head_size: int | None
) -> str | None:
    if device.type != "cuda":
        return f"flash-attn runs only on CUDA, not {device.type}"
    if importlib.util.find_spec("flash_attn") is None:
        return "flash-attn is not installed"
    from engine.model_executor.attention import flash_attn_backend

    return flash_attn_backend.unsupported_reason(block_size, dtype, head_size)


def get_attn_backend(
    name: str,
    device: torch.device | str,
    *,
    block_size: int | None = None,
    dtype: torch.dtype | None = None,
    head_size: int | None = None,
) -> type[AttentionBackend]:
    """Resolve a backend name for `device`; the keyword facts, when known, let "auto" avoid unmet constraints
    (`dtype` is the KV cache's: an fp8 one rules out flash-attn).

    "auto": flash-attn on CUDA when importable and block_size is known to be a multiple of 256,
    else triton on CUDA, else torch. An explicit name that cannot run here raises
    AttentionBackendUnavailableError saying why.
    """
    device = torch.device(device)
    if name == "auto":
        if device.type != "cuda":
            name = "torch"
        elif block_size is not None and _flash_attn_unavailable_reason(device, block_size, dtype, head_size) is None:
            name = "flash-attn"
        elif _triton_unavailable_reason(device, head_size, dtype) is None:
            name = "triton"
        else:
            name = "torch"
    if name == "torch":
        return TorchAttentionBackend
    if name == "triton":
        reason = _triton_unavailable_reason(device, head_size, dtype)
        if reason is not None:
            raise AttentionBackendUnavailableError(reason)
        from engine.model_executor.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend
    if name == "flash-attn":
        reason = _flash_attn_unavailable_reason(device, block_size, dtype, head_size)
        if reason is not None:
            raise AttentionBackendUnavailableError(reason)
        from engine.model_executor.attention.flash_attn_backend import FlashAttentionBackend

        return FlashAttentionBackend
    raise ValueError(f"unknown attention backend {name!r}; valid: {', '.join(map(repr, BACKEND_NAMES))}")
