"""Qwen2 / Qwen2.5: the Llama decoder with a bias on q/k/v (never on o_proj)."""
from __future__ import annotations

from engine.model_executor.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
    o_bias = False
