"""The fused Triton MoE path against the torch reference on CPU, through Triton's interpreter (as
test_triton_attention.py runs the attention kernels, and for the same reason re-decorating the kernels
under TRITON_INTERPRET=1); test_fused_moe_gpu.py runs it compiled on CUDA."""
from __future__ import annotations


import pytest
from triton_interp import interpreted as interpreter
import torch

from engine.model_executor.layers import moe
from engine.model_executor.layers.moe import SparseMoeBlock, route

JIT_MODULES = ("engine.model_executor.layers.fused_moe",)
H, I, E, TOP_K = 64, 32, 8, 2


@pytest.fixture(scope="module")
def interpreted():
    """The fused_moe module with its kernels built by Triton's interpreter, for this module's CPU tests."""
    with interpreter(JIT_MODULES):
        from engine.model_executor.layers import fused_moe

        assert fused_moe.kernels_interpreted()
        yield fused_moe


def make_block(device: str = "cpu", dtype: torch.dtype = torch.float32, weights_in_hidden_dtype: bool = False,
               num_experts: int = E, top_k: int = TOP_K) -> SparseMoeBlock:
    torch.manual_seed(0)
    block = SparseMoeBlock(H, I, num_experts, top_k, renormalize=True, weights_in_hidden_dtype=weights_in_hidden_dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.15)
    return block.to(device=device, dtype=dtype)


def routed(block: SparseMoeBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = route(block.gate(x), block.top_k, block.renormalize)
    return (weights.to(x.dtype) if block.weights_in_hidden_dtype else weights), ids


@pytest.mark.parametrize("num_tokens", [1, 5, 33])
def test_fused_experts_equal_the_torch_reference(interpreted, num_tokens):
    block = make_block()
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(num_tokens))
    with torch.no_grad():
        weights, ids = routed(block, x)
        out = interpreted.fused_experts(x, block.w13_weight, block.w2_weight, weights, ids)
        torch.testing.assert_close(out, block.forward_reference(x, weights, ids), atol=1e-5, rtol=1e-5)


def test_fused_experts_in_bf16_stay_within_bf16_rounding_of_the_reference(interpreted):
    block = make_block(dtype=torch.bfloat16, weights_in_hidden_dtype=True)
    x = torch.randn(17, H, generator=torch.Generator().manual_seed(7)).bfloat16()
    with torch.no_grad():
        weights, ids = routed(block, x)
        out = interpreted.fused_experts(x, block.w13_weight, block.w2_weight, weights, ids)
        torch.testing.assert_close(out.float(), block.forward_reference(x, weights, ids).float(), atol=2e-2, rtol=2e-2)


def test_pairs_are_grouped_by_expert_in_token_order_and_padded_to_whole_blocks(interpreted):
    ids = torch.tensor([[3, 1], [1, 0], [3, 2]])  # pairs 0..5 (token * top_k + slot)
    pairs, block_expert = interpreted.align_by_expert(ids, num_experts=8, block_m=4)
    pad = 6
    assert pairs.tolist()[:16] == [3, pad, pad, pad, 1, 2, pad, pad, 5, pad, pad, pad, 0, 4, pad, pad]
    assert block_expert.tolist()[:4] == [0, 1, 2, 3] and set(block_expert.tolist()[4:]) <= {-1}
    assert set(pairs.tolist()[16:]) <= {pad}


def test_every_token_routed_to_one_expert_fills_consecutive_blocks_of_it(interpreted):
    block = make_block(num_experts=4, top_k=1)
    x = torch.randn(40, H, generator=torch.Generator().manual_seed(3))
    ids = torch.full((40, 1), 2)
    weights = torch.ones(40, 1)
    with torch.no_grad():
        out = interpreted.fused_experts(x, block.w13_weight, block.w2_weight, weights, ids)
        torch.testing.assert_close(out, block.forward_reference(x, weights, ids), atol=1e-5, rtol=1e-5)


def test_block_forward_takes_the_fused_path_where_its_kernels_can_run(interpreted, monkeypatch):
    block = make_block()
    calls = []
    monkeypatch.setattr(interpreted, "fused_experts", lambda *a: calls.append(a) or torch.zeros_like(a[0]))
    with torch.no_grad():
        block(torch.randn(3, H))
    assert len(calls) == 1


def test_without_triton_interpret_a_cpu_block_keeps_the_torch_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not moe.fused_path_usable(torch.zeros(1))


def test_expert_counts_hold_the_tokens_each_expert_received():
    block = make_block()
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, ids = routed(block, x)
        block(x)
    assert block.expert_counts.tolist() == torch.bincount(ids.reshape(-1), minlength=E).tolist()


def test_routing_counters_pool_the_layers():
    a, b = make_block(), make_block()
    a.expert_counts.copy_(torch.tensor([5, 0, 0, 1, 0, 0, 0, 0]))  # 2 experts active, busiest 5
    b.expert_counts.copy_(torch.tensor([1, 1, 1, 1, 2, 0, 0, 0]))  # 5 experts active
    assert moe.routing_counters([a, b]).tolist() == [5, 7, 5]

