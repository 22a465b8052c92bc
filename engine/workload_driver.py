"""Driving an engine with a workload on the wall clock: each request submitted at its arrival time
while the engine steps. `engine run` does it with the stepscope engine, `--backend vllm` with vLLM's."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from tqdm import tqdm

from engine.core.sampling_params import SamplingParams

class WorkloadScale(TypedDict):
    """Keyword arguments of `Workload.scaled`."""

    num_requests: int
    length_factor: float


# What the default workload is cut to on a CPU, so `engine run` finishes in well under a minute there.
# Its context is cut with it, and its KV cache to one longest sequence (engine.run.cpu_default_sizes):
# bursts then wait for blocks and decodes preempt, so the default run has queueing to explain.
CPU_SCALE: WorkloadScale = {"num_requests": 48, "length_factor": 0.25}
CPU_MAX_MODEL_LEN = 1024  # bursty.yaml's longest prompt + output (4096 tokens) times the length factor
IDLE_POLL_S = 0.05  # the longest an idle engine sleeps between looks at the clock (and trace flushes)


@dataclass(slots=True)
class RunResult:
    num_submitted: int
    interrupted: bool
    wall_time: float


class WorkloadEngine(Protocol):
    """What `run_workload` drives: the stepscope engine (LLMEngine), or vLLM's through its adapter."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams, arrival_time: float) -> Any: ...

    def refuse_long_prompt(self, request_id: str, num_prompt_tokens: int, arrival_time: float) -> None:
        """End a request whose prompt is longer than max_model_len as an error, its ids never made."""

    def idle(self) -> None:
        """Nothing to step until the next arrival: write out what the trace holds, so a kill loses none of it."""

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list: ...


def run_workload(engine: WorkloadEngine, workload, time_scale: float = 1.0, max_requests: int | None = None,
                 progress: bool = True) -> RunResult:
    """Drive the engine with the workload; Ctrl-C stops submitting and ends the run cleanly."""
    stream = workload.requests(vocab_size=engine.vocab_size, limit=max_requests, time_scale=time_scale,
                               max_prompt_tokens=engine.max_model_len)
    nxt = next(stream, None)
    start = time.monotonic()
    submitted = 0
    interrupted = False
    bar = tqdm(total=workload.count(max_requests) if progress else None, desc="requests", unit="req",
               disable=not progress, dynamic_ncols=True)
    try:
        while True:
            now = time.monotonic()
            while nxt is not None and start + nxt.arrival <= now:
                if nxt.prompt_token_ids is None:  # too long: its ids were never made
                    engine.refuse_long_prompt(nxt.request_id, nxt.num_prompt_tokens, start + nxt.arrival)
                else:
                    engine.add_request(nxt.request_id, {"prompt_token_ids": nxt.prompt_token_ids},
                                       SamplingParams(max_tokens=nxt.max_tokens, temperature=0.0, ignore_eos=True),
                                       arrival_time=start + nxt.arrival)
                submitted += 1
                nxt = next(stream, None)
            if engine.has_unfinished_requests():
                bar.update(len(engine.step()))
            elif nxt is not None:
                engine.idle()
                time.sleep(max(0.0, min(start + nxt.arrival - time.monotonic(), IDLE_POLL_S)))
            else:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
    return RunResult(submitted, interrupted, time.monotonic() - start)
