"""A request as the scheduler tracks it: tokens, progress, status and the timestamps a trace needs."""
from __future__ import annotations

import enum
from collections.abc import Sequence

from engine.core.hashing import BlockHash, extra_keys_for, hash_blocks
from engine.core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """WAITING -> RUNNING <-> PREEMPTED -> FINISHED_*; everything above PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """Mutable per-request state owned by the scheduler; `block_hashes` grows as blocks fill."""

    # Slots are laid out in this order: what every step reads and writes comes first, so that a step
    # touches two cache lines per request rather than four.
    __slots__ = (
        "request_id", "all_token_ids", "output_token_ids", "num_computed_tokens", "num_output_placeholders",
        "num_in_flight_tokens", "num_stale_output_tokens", "is_prefill_chunk", "status", "first_token_time",
        "block_size", "num_tokens_limit", "stop_token_set", "sampling_params", "max_tokens", "eos_token_id",
        "num_cached_tokens",
        "prompt_token_ids", "priority", "arrival_time", "cache_salt", "num_preemptions", "block_hashes",
        "stop_reason", "error", "_extra_keys", "queued_time", "first_scheduled_time", "finished_time",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_id: int | None = None, arrival_time: float = 0.0, priority: int = 0,
                 cache_salt: str | None = None, block_size: int | None = None,
                 block_hashes: Sequence[BlockHash] = ()) -> None:
        """`block_hashes`: those of the prompt's first full blocks at `block_size`, where the caller has
        them already (a simulator adding the same prompt in run after run); the rest are computed."""
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids = list(self.prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.arrival_time = arrival_time
        self.cache_salt = cache_salt
        self.max_tokens = sampling_params.max_tokens
        # Sampled tokens that can end the request (EOS unless ignored, and the stop ids), and the length
        # that ends it (the scheduler sets it once max_tokens is known): any other token, short of that
        # length, cannot stop it, which spares the full stop check for most tokens.
        may_stop = set(sampling_params.stop_token_ids)
        if eos_token_id is not None and not sampling_params.ignore_eos:
            may_stop.add(eos_token_id)
        self.stop_token_set = frozenset(may_stop)
        self.num_tokens_limit = 0
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.queued_time: float | None = None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # Async scheduling (vLLM 0.32 AsyncScheduler): tokens scheduled but not yet sampled back count as
        # placeholders; tokens of steps still in flight; and, after a preemption, how many of those belong
        # to steps scheduled before it (their sampled tokens still arrive and are appended).
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.is_prefill_chunk = False
        self._extra_keys = extra_keys_for(cache_salt)
        self.block_size = block_size
        self.block_hashes: list[BlockHash] = list(block_hashes)
        self.update_block_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_left(self) -> int:
        """Tokens still to compute, the placeholders of steps in flight (async scheduling) included."""
        return len(self.all_token_ids) + self.num_output_placeholders - self.num_computed_tokens

    def is_decoding(self) -> bool:
        """Its next step computes the one token after all the others, an output token: a decode."""
        if len(self.all_token_ids) + self.num_output_placeholders - self.num_computed_tokens != 1:
            return False
        if self.num_output_placeholders or self.output_token_ids:
            return True
        return False

    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    def get_finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self.status)

    def append_output_token_ids(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.block_size and len(self.all_token_ids) % self.block_size == 0:
            self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash every newly completed full block, chaining from the last known hash."""
        if not self.block_size:
            return
        hashes = self.block_hashes
        if len(self.all_token_ids) // self.block_size > len(hashes):
            hashes += hash_blocks(self.all_token_ids, self.block_size, len(hashes), hashes[-1] if hashes else None,
                                  self._extra_keys)

    def __lt__(self, other: Request) -> bool:
        """Priority order: lower `priority` first, then earlier arrival, then id (a stable tie-break)."""
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority, other.arrival_time, other.request_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")


def check_stop(req: Request, max_model_len: int) -> bool:
    """vLLM 0.32's order: EOS, then stop token ids, then length. EOS and stop ids count only after
    min_tokens (vLLM's sampler masks them until then; our simulator feeds recorded tokens)."""
    num_outputs = len(req.output_token_ids)
    params = req.sampling_params
    if num_outputs >= params.min_tokens:
        last = req.output_token_ids[-1]
        if not params.ignore_eos and last == req.eos_token_id:
            req.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in params.stop_token_ids:
            req.status = RequestStatus.FINISHED_STOPPED
            req.stop_reason = last
            return True
    if len(req.all_token_ids) >= max_model_len or (req.max_tokens is not None and num_outputs >= req.max_tokens):
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def append_output_tokens(req: Request, new_ids: list[int], max_model_len: int) -> tuple[list[int], bool]:
    """Append sampled tokens up to the first that stops the request; returns the kept tokens and whether
    it stopped (several tokens per step come from speculative decoding or a replayed trace)."""
    for k, tok in enumerate(new_ids):
        req.append_output_token_ids(tok)
        if check_stop(req, max_model_len):
            return new_ids[:k + 1], True
    return new_ids, False


class RefusedRequest(Request):
    """A request refused before its prompt's ids were made (too long to serve): it knows their number only."""

    __slots__ = ("_num_prompt_tokens",)

    def __init__(self, request_id: str, num_prompt_tokens: int, sampling_params: SamplingParams,
                 arrival_time: float = 0.0) -> None:
        super().__init__(request_id, [], sampling_params, arrival_time=arrival_time)
        self._num_prompt_tokens = num_prompt_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt_tokens


def admission_error(req: Request, max_model_len: int, block_size: int, num_usable_blocks: int) -> str | None:
    """Why `req` could never run, or None: such a request is rejected when added, not left to stall the
    queue. `max_tokens` is already set (the scheduler fills in a missing one)."""
    n = req.num_prompt_tokens
    if n == 0:
        return "prompt is empty"
    if n >= max_model_len:  # vLLM 0.32's input processor: room for at least one output token
        return (f"prompt has {n} tokens, longer than max_model_len={max_model_len} allows "
                "(one output token must fit too)")
    need = -(-min(n + req.max_tokens if req.max_tokens is not None else max_model_len, max_model_len) // block_size)
    if need > num_usable_blocks:
        return (f"prompt {n} + max_tokens {req.max_tokens} needs {need} KV blocks of {block_size} tokens "
                f"but the cache has {num_usable_blocks}")
    return None
