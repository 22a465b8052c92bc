"""Rotary position embedding (neox-style halves, as Llama and Qwen use) with a precomputed cos/sin cache."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def rope_params_from_config(hf_config: Any) -> tuple[float, dict | None]:
    """(theta, scaling dict or None) from either transformers 5 `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = getattr(hf_config, "rope_parameters", None)
    scaling: dict[str, Any] | None
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = params
    else:
        theta = float(getattr(hf_config, "rope_theta", 10000.0))
        scaling = getattr(hf_config, "rope_scaling", None)
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    return theta, {**scaling, "rope_type": rope_type}


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1 scaling: keep high frequencies, divide low ones by `factor`, blend smoothly in between."""
    factor = scaling["factor"]
    low_ff, high_ff = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low_ff, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high_ff) & (wavelen <= old_len / low_ff)
    return torch.where(medium, blended, scaled)


def compute_inv_freq(rotary_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {scaling['rope_type']!r}; supported: default, llama3")


@dataclass(slots=True)
class RopeInputs:
    """A forward's rotary inputs, looked up once and handed to every layer: the positions, and the cos/sin
    factors of `RotaryEmbedding.cos_sin`, or None where a fused CPU kernel (cpu_ops) reads the cache."""

    positions: torch.Tensor
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None


class RotaryEmbedding(nn.Module):
    """Rotates the first `rotary_dim` features of each q/k head by angles looked up from `positions`."""

    cos_sin_cache: torch.Tensor  # [max_position, rotary_dim]: cos half, sin half (a buffer)

    def __init__(
        self, head_size: int, rotary_dim: int, max_position: int, base: float, scaling: dict | None = None
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        inv_freq = compute_inv_freq(rotary_dim, base, scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq.to(torch.float32))
        # Built in float32 once; bf16 angles at large positions would be badly off.
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token factors [T, 1, rotary_dim] for `rotate`: cos twice, and sin as (-sin, sin).

        A model looks them up once per forward and hands them to every layer. The sign folded into
        sin turns neox rotation into x * cos + swap_halves(x) * sin, which rounds exactly as
        x1 * cos - x2 * sin and x2 * cos + x1 * sin do."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        return torch.cat([cos, cos], dim=-1)[:, None, :], torch.cat([-sin, sin], dim=-1)[:, None, :]

    def rotate(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, heads, head_size] -> a rotated float copy in x's dtype."""
        cos, sin = cos_sin
        rot = x[..., : self.rotary_dim].float()
        half = self.rotary_dim // 2
        x1, x2 = rot.chunk(2, dim=-1)
        # swap_halves(x) * sin written half by half into one buffer: the same products as through a
        # concatenated copy of x, one full-size pass fewer.
        swapped = torch.empty_like(rot)
        torch.mul(x2, sin[..., :half], out=swapped[..., :half])
        torch.mul(x1, sin[..., half:], out=swapped[..., half:])
        rotated = (rot * cos).add_(swapped).to(x.dtype)
        if self.rotary_dim < self.head_size:
            rotated = torch.cat([rotated, x[..., self.rotary_dim :]], dim=-1)
        return rotated

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query [T, nh*d] or [T, nh, d], key likewise; returns rotated copies of the same shapes."""
        cos_sin = self.cos_sin(positions)
        return (self.rotate(query.view(query.shape[0], -1, self.head_size), cos_sin).view(query.shape),
                self.rotate(key.view(key.shape[0], -1, self.head_size), cos_sin).view(key.shape))
