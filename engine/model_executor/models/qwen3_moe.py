"""Qwen3-MoE: Qwen3 attention (q/k RMSNorm); every `decoder_sparse_step`-th layer not in `mlp_only_layers`
has a sparse MoE block of width `moe_intermediate_size`, the others a dense MLP of `intermediate_size`."""
from __future__ import annotations

from typing import Any

from torch import nn

from engine.model_executor.models.llama import dense_mlp
from engine.model_executor.models.moe import MoeForCausalLM, moe_block


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """Whether Qwen3-MoE layer `layer_idx` has a MoE block (else a dense MLP)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_idx + 1) % step == 0
    )


class Qwen3MoeForCausalLM(MoeForCausalLM):
    qk_norm = True

    def make_mlp(self, config: Any, layer_idx: int) -> nn.Module:
        if not is_sparse_layer(config, layer_idx):
            return dense_mlp(config, layer_idx)
        return moe_block(config, config.moe_intermediate_size, config.num_experts,
                         renormalize=bool(getattr(config, "norm_topk_prob", False)), weights_in_hidden_dtype=True)
