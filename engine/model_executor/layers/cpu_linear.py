"""Linear layers with weights pre-packed for oneDNN, for CPU inference.

oneDNN reorders a weight once into the blocked layout its matmul kernels read; torch's default
F.linear goes to MKL every step. oneDNN has bf16 kernels only on CPUs with AVX-512 (BW, VL, DQ) or
AVX-NE-CONVERT: elsewhere a bf16 weight stays an nn.Linear, and the caller is told.
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


@dataclass(slots=True)
class Packing:
    """What `pack_linears` did: layers swapped, and layers left unpacked because oneDNN has no kernel
    for their dtype on this CPU."""
    packed: int = 0
    unsupported: int = 0


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
                    done.unsupported += 1
    return done
