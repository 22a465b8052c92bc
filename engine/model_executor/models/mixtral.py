"""Mixtral: Llama attention; every layer's feed-forward is a sparse MoE block whose experts (w1 gate,
w3 up, w2 down) are `intermediate_size` wide, the top-k routing weights always renormalised."""
from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from engine.model_executor.models.moe import MoeForCausalLM, moe_block


class MixtralForCausalLM(MoeForCausalLM):
    expert_params: ClassVar[dict[str, tuple[str, int]]] = {
        "w1": ("w13_weight", 0),
        "w3": ("w13_weight", 1),
        "w2": ("w2_weight", 0),
    }
    checkpoint_renames: ClassVar[dict[str, str]] = {".block_sparse_moe.": ".mlp."}

    def __init__(self, config: Any, attn_backend: str = "auto") -> None:
        if getattr(config, "sliding_window", None) is not None:
            raise ValueError("model config: sliding_window is set; sliding-window attention is not supported")
        super().__init__(config, attn_backend)

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        return moe_block(config, config.intermediate_size, config.num_local_experts,
                         renormalize=True, weights_in_hidden_dtype=False)
