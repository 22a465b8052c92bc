"""The fused Triton MoE path on CUDA, compiled, against the torch reference (test_fused_moe.py runs the
same kernels through Triton's interpreter on CPU)."""
from __future__ import annotations

import pytest
import torch

from test_fused_moe import H, make_block, routed

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("num_tokens", [1, 7, 256])
def test_fused_experts_on_cuda_equal_the_torch_reference(dtype, tol, num_tokens):
    from engine.model_executor.layers import fused_moe

    if fused_moe.kernels_interpreted():
        pytest.skip("TRITON_INTERPRET is set: this test is for compiled kernels on CUDA")
    block = make_block("cuda", dtype, weights_in_hidden_dtype=dtype != torch.float32, num_experts=64, top_k=8)
    x = torch.randn(num_tokens, H, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).to(dtype)
    with torch.no_grad():
        weights, ids = routed(block, x)
        out = block(x)  # on CUDA the block takes the fused path
        torch.testing.assert_close(out.float(), block.forward_reference(x, weights, ids).float(), atol=tol, rtol=tol)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # no host sync: the fused path is capturable
            captured = block(x)
        graph.replay()
        torch.testing.assert_close(captured, out)
