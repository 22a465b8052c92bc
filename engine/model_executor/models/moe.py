"""The Llama-family decoder with sparse Mixture-of-Experts feed-forward blocks (layers/moe.py).

Attention, norms and dense layers are the Llama decoder's; a subclass says which layers are sparse, how the
router's top-k weights are treated, and how its checkpoint names the experts' tensors. `load_weights` fills
each expert's separate gate/up/down tensors into the stacked expert parameters and hands every other
tensor to the dense loader.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from engine.model_executor.layers.moe import SparseMoeBlock
from engine.model_executor.models.llama import LlamaForCausalLM

# "<layer prefix>.<mlp>.experts.<expert id>.<projection>.weight"
_EXPERT_RE = re.compile(r"^(?P<mlp>.+)\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


class MoeForCausalLM(LlamaForCausalLM):
    """Base of the MoE models: subclasses set the class attributes and `make_mlp`."""

    # checkpoint expert projection -> (stacked parameter of SparseMoeBlock, row block within one expert)
    expert_params: ClassVar[dict[str, tuple[str, int]]] = {
        "gate_proj": ("w13_weight", 0),
        "up_proj": ("w13_weight", 1),
        "down_proj": ("w2_weight", 0),
    }
    # checkpoint name fragment -> this model's (e.g. Mixtral's "block_sparse_moe" is our layer's "mlp")
    checkpoint_renames: ClassVar[dict[str, str]] = {}

    def sparse_blocks(self) -> dict[str, SparseMoeBlock]:
        """Every MoE block by its module name, e.g. "model.layers.1.mlp"."""
        return {name: m for name, m in self.named_modules() if isinstance(m, SparseMoeBlock)}

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        blocks = self.sparse_blocks()
        # stacked parameter name -> the (expert, row block) pieces that arrived
        pieces_seen: dict[str, set[tuple[int, int]]] = {}

        def dense(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            """Copies the expert tensors in as they pass; yields the rest under this model's names."""
            for name, tensor in named:
                for old, new in self.checkpoint_renames.items():
                    name = name.replace(old, new)
                match = _EXPERT_RE.match(name)
                if match is None:
                    yield name, tensor
                    continue
                block = blocks.get(match["mlp"])
                if block is None or match["proj"] not in self.expert_params:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching expert in {type(self).__name__}")
                expert = int(match["expert"])
                if expert >= block.num_experts:
                    raise ValueError(f"checkpoint tensor {name!r}: {match['mlp']} has {block.num_experts} experts")
                param, piece = self.expert_params[match["proj"]]
                dest: torch.Tensor = getattr(block, param).data[expert]
                rows = dest.shape[0] // self._pieces(param)
                dest = dest.narrow(0, piece * rows, rows)
                if dest.shape != tensor.shape:
                    raise ValueError(
                        f"shape mismatch for {name!r}: checkpoint {tuple(tensor.shape)}, model {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                pieces_seen.setdefault(f"{match['mlp']}.{param}", set()).add((expert, piece))

        loaded = super().load_weights(dense(weights))
        # a stacked parameter counts as loaded only once every expert's every piece arrived
        for target, seen in pieces_seen.items():
            block = blocks[target.rsplit(".", 1)[0]]
            if len(seen) == block.num_experts * self._pieces(target.rsplit(".", 1)[1]):
                loaded.add(target)
        return loaded

    def _pieces(self, param: str) -> int:
        """How many checkpoint tensors make up one expert's slice of stacked parameter `param`."""
        return sum(1 for p, _ in self.expert_params.values() if p == param)


def moe_block(config: Any, intermediate_size: int, num_experts: int, renormalize: bool,
              weights_in_hidden_dtype: bool) -> nn.Module:
    """A SparseMoeBlock of `num_experts` experts of width `intermediate_size`, top-`num_experts_per_tok`."""
    return SparseMoeBlock(config.hidden_size, intermediate_size, num_experts, config.num_experts_per_tok,
                          renormalize, weights_in_hidden_dtype)
