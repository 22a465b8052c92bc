"""What one launched step carries between the model runner's `execute_model` and `sample_tokens`.

Async scheduling (a batch queue of two) launches step k+1 before step k's tokens reach the host, in one
of three ways (`STEP_OVERLAPS`):
- "none": vLLM's synchronous split, forward in `execute_model`, sampling in `sample_tokens` (under async
  scheduling the previous step's sampling runs first thing in the next `execute_model`).
- "launch" (the default under async scheduling): forward and sampling are queued together and the
  sampled ids copied to pinned host memory behind a CUDA event that `sample_tokens` waits on. On CUDA
  the host prepares step k+1 while the device runs step k; a CPU runs the same code without overlap.
- "thread": the "launch" work in a worker thread, so the CPU's main thread prepares the next step
  meanwhile; it need not pay, as a small model's forward is mostly Python and the threads share the GIL.
In each, decode inputs whose token the previous step samples (the scheduler's placeholders) are copied
from that step's sampled-id tensor where it lives, never through the host. A MoE model's routing counters
travel to the host the same way as the sampled ids (`MoeCounters`).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.core.outputs import MoeStepStats
from engine.model_executor.forward_context import AttentionMetadata
from engine.model_executor.layers.sampler import LogprobsTensors, SamplerOutput, SamplingMetadata
from engine.worker.input_batch import BatchInputs

STEP_OVERLAPS = ("none", "launch", "thread")
# The runner's token list holds this where a token is sampled but not yet on the host.
PLACEHOLDER_TOKEN = -1
# LogprobsTensors on the host: per row the token ids and logprobs (sampled token first), and its rank.
HostLogprobs = tuple[list[list[int]], list[list[float]], list[int]]


@dataclass(slots=True)
class PreparedStep:
    """Host work of one step, done before its launch: the batch and its inputs already on the device."""

    batch: BatchInputs
    input_ids: torch.Tensor
    positions: torch.Tensor
    # Flat batch positions whose token the previous step samples, and that step's sampled-id rows for them.
    placeholders: tuple[torch.Tensor, torch.Tensor] | None
    metadata: AttentionMetadata | None  # None when the step replays a CUDA graph
    graph_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # slot_mapping, seq_lens, block_table
    logits_index: torch.Tensor | None  # the hidden-state rows that sample; None when no row samples
    sampling: SamplingMetadata | None
    banned: list[tuple[int, list[int]]]  # (sample row, token ids that min_tokens forbids)
    # Per sample row: the request's token list and the index its placeholder holds there.
    slots: list[tuple[list[int], int]] = field(default_factory=list)
    logprob_reqs: list[tuple[int, str, int]] = field(default_factory=list)  # (sample row, request id, k)
    moe: MoeCounters | None = None  # set by the forward of a MoE model


class StepOutput:
    """One step's sampled ids (and logprobs) on their way to the host. On CUDA the copies go to pinned
    memory without blocking and an event marks their end, so nothing waits until `to_host`."""

    __slots__ = ("sampled", "logprobs", "event")

    def __init__(self, out: SamplerOutput, device: torch.device) -> None:
        lp = out.logprobs_tensors
        self.event: torch.cuda.Event | None = None
        self.sampled: torch.Tensor
        self.logprobs: LogprobsTensors | None
        if device.type != "cuda":
            self.sampled, self.logprobs = out.sampled_token_ids, lp
            return
        self.sampled = _to_pinned(out.sampled_token_ids)
        self.logprobs = None if lp is None else LogprobsTensors(
            _to_pinned(lp.logprob_token_ids), _to_pinned(lp.logprobs), _to_pinned(lp.selected_token_ranks))
        # A blocking event: the host sleeps in `synchronize` instead of spinning on the driver.
        self.event = torch.cuda.Event(blocking=True)
        self.event.record()

    def to_host(self) -> tuple[list[int], HostLogprobs | None]:
        if self.event is not None:
            self.event.synchronize()
        lp = self.logprobs
        if lp is None:
            return self.sampled.tolist(), None
        return self.sampled.tolist(), (lp.logprob_token_ids.tolist(), lp.logprobs.tolist(),
                                       lp.selected_token_ranks.tolist())


class MoeCounters:
    """One step's routing counters (layers.moe `routing_counters`) on their way to the host: on CUDA
    copied to pinned memory behind their own event (a step that samples nothing has no StepOutput), so
    reading them never waits for the steps launched after this one."""

    __slots__ = ("values", "num_layers", "event")

    def __init__(self, values: torch.Tensor, num_layers: int) -> None:
        self.num_layers = num_layers
        self.event: torch.cuda.Event | None = None
        if values.device.type != "cuda":
            self.values = values
            return
        self.values = _to_pinned(values)
        self.event = torch.cuda.Event(blocking=True)
        self.event.record()

    def to_host(self) -> MoeStepStats:
        if self.event is not None:
            self.event.synchronize()
        most, total, tokens = self.values.tolist()
        return MoeStepStats(most, total / self.num_layers, tokens)


@dataclass(slots=True)
class PendingStep:
    """A launched step until `sample_tokens` takes it: exactly one of future / output / logits is the
    way to its tokens ("thread", "launch", "none"); prep is None for a step that scheduled nothing."""

    prep: PreparedStep | None
    future: Future | None = None
    output: StepOutput | None = None
    logits: torch.Tensor | None = None
    sampled: bool = False
    error: Exception | None = None


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def to_device(a: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host array to `device` without making the host wait for the device's queue: through pinned
    memory and a non-blocking copy on CUDA (a pageable or blocking copy would synchronise the stream)."""
    t = torch.from_numpy(a) if isinstance(a, np.ndarray) else a
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
