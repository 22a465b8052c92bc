"""`LLM`: offline batch generation, the top of the call chain (vLLM's entrypoints/llm.py)."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from tqdm import tqdm

from engine.config import EngineArgs, bound_openmp_spin
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput

Prompt = str | dict


class LLM:
    """`LLM(model=None, **engine_args)`: None means the built-in model; engine flags in snake_case."""

    def __init__(self, model: str | None = None, **kwargs) -> None:
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"LLM: unknown engine argument(s) {', '.join(unknown)}")
        bound_openmp_spin()  # before the engine loads torch, which starts its OpenMP runtime
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._counter = itertools.count()

    def shutdown(self, **final_meta) -> None:
        """Finish the trace directory, if this LLM writes one (`interrupted=True`: a run cut short)."""
        self.llm_engine.shutdown(**final_meta)

    def reset_prefix_cache(self) -> bool:
        """Forget cached prefixes (refused, False, while requests hold blocks), as vLLM's LLM does."""
        return self.llm_engine.engine_core.reset_prefix_cache()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of `prompts`."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        ids = []
        for prompt, p in zip(prompts, params):
            rid = str(next(self._counter))
            ids.append(rid)
            self.llm_engine.add_request(rid, prompt, p)
        return self._run_engine(ids, use_tqdm)

    def _run_engine(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True) as bar:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    done[out.request_id] = out
                    bar.update(1)
        return [done[rid] for rid in ids]
