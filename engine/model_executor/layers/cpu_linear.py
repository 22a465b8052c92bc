"""Linear layers with weights pre-packed for oneDNN, for CPU inference.

oneDNN reorders a weight once into the blocked layout its matmul kernels read; torch's default
F.linear goes to MKL every step. oneDNN has bf16 kernels only on CPUs with AVX-512 (BW, VL, DQ) or
AVX-NE-CONVERT; elsewhere torch's own bf16 GEMM is many times slower than float32 once a batch has
more than a few rows, so a bf16 layer there multiplies in float32 instead (`UpcastLinear`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def onednn_packing_available() -> bool:
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """Inference-only stand-in for an nn.Linear: same maths, weight held in oneDNN's layout."""

    def __init__(self, linear: nn.Linear, batch_size_hint: int) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features).contiguous(),
                                                 self.packed_weight, self.bias, "none", [], "")
        return out.view(*lead, self.out_features)


class UpcastLinear(nn.Module):
    """A linear whose weight stays in its own dtype (bf16: half the memory) and is multiplied in float32,
    upcast one layer at a time. Products of bf16 values are exact in float32 and the sums accumulate in
    float32, as a bf16 GEMM's do; the output is rounded back to the input's dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach()
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(x.float(), self.weight.float(), bias).to(x.dtype)


@dataclass(slots=True)
class Packing:
    """What `pack_linears` did: layers packed for oneDNN, and layers oneDNN has no kernel for on this CPU
    (bf16 without AVX-512 or AVX-NE-CONVERT), swapped for an UpcastLinear."""
    packed: int = 0
    upcast: int = 0


def pack_linears(model: nn.Module, batch_size_hint: int) -> Packing:
    """Swap every CPU nn.Linear of a packable dtype for a PackedLinear.

    Call after the weights are loaded: the packed copy does not follow later writes to the weight.
    """
    done = Packing()
    if not onednn_packing_available():
        return done
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype in _PACKABLE_DTYPES):
                try:
                    setattr(parent, name, PackedLinear(child, batch_size_hint))
                    done.packed += 1
                except RuntimeError:  # e.g. bf16 on an AVX2-only CPU: no oneDNN kernel to pack for
                    setattr(parent, name, UpcastLinear(child))
                    done.upcast += 1
    return done
