"""RMSNorm computed in float32, as the reference checkpoints were trained with."""
from __future__ import annotations

import torch
from torch import nn

from engine.model_executor.layers import cpu_ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dim, the rms taken in float32; weight broadcasts, so one call
    can normalise q and k heads together with their own weights stacked.

    The arithmetic is transformers' (x * rsqrt(mean(x^2) + eps), cast, then times weight), with the
    small [..., 1] factor and the final product done in place: two full-size temporaries, not four.
    """
    xf = x.float()
    inv_rms = xf.pow(2).mean(dim=-1, keepdim=True).add_(eps).rsqrt_()
    y = (xf * inv_rms).to(x.dtype)
    if weight.dtype == y.dtype and weight.shape == y.shape[y.dim() - weight.dim():]:
        return y.mul_(weight)  # the usual case, decided without torch's broadcasting helpers (slow per call)
    if torch.result_type(y, weight) != y.dtype or y.shape != torch.broadcast_shapes(y.shape, weight.shape):
        return weight * y
    return y.mul_(weight)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Plain norm, or with `residual`: add it first and also return the sum as the new residual.

        The fused form lets a decoder layer carry the residual stream without extra adds at call sites.
        The sum is written into `x` (the layer's fresh attention or MLP output, read nowhere else), so
        the residual stream costs no allocation per layer.
        """
        if x.device.type == "cpu":  # one fused pass (cpu_ops) where it takes these tensors
            out = cpu_ops.rms_norm(x, self.weight, self.eps, residual)
            if out is not None:
                return out if residual is None else (out, x)
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        x = x.add_(residual) if x.dtype == torch.result_type(x, residual) else x + residual
        return rms_norm(x, self.weight, self.eps), x
