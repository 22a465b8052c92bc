"""stepscope's live engine, in the shape of vLLM v1.

`engine.core` is torch-free and is shared with the simulator, so this package must not import torch
eagerly: `LLM` is resolved lazily on first attribute access.
"""
from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.entrypoints.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
