"""Linear layers with weights pre-packed for oneDNN, for CPU inference.

oneDNN reorders a weight once into the blocked layout its matmul kernels read; torch's default
F.linear goes to MKL every step. On this AMD EPYC, 1 thread, a hidden-512 layer's four matmuls ran
1.50x faster at 64 rows (0.34 against 0.51 s for 20 passes) and 1.27x at 256 rows once packed.
"""
from __future__ import annotations

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


def pack_linears(model: nn.Module, batch_size_hint: int) -> int:
    """Swap every CPU nn.Linear of a packable dtype for a PackedLinear; returns how many were swapped.

    Call after the weights are loaded: the packed copy does not follow later writes to the weight.
    """
    if not onednn_packing_available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype in _PACKABLE_DTYPES):
                setattr(parent, name, PackedLinear(child, batch_size_hint))
                swapped += 1
    return swapped
