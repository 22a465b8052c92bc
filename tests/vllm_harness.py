"""Drive vLLM 0.32's own scheduler and engine.core's side by side on one request stream.

Each side gets the same requests at the same driver ticks and a fake model that samples one token per
request whose scheduled chunk reaches its last known token; the token at output position i is a fixed
function of the request and i (EOS at a chosen position), so both sides see the same tokens as long as
they decide the same. A tick follows vLLM's engine core: synchronous `step` (schedule, execute, update),
or `step_with_batch_queue` with a queue of two (schedule k+1 before updating k; drain at the end).
Each side logs, per tick, what it scheduled (request, tokens), whom it preempted, every request's block
ids, and which requests finished and why; the logs must be equal.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EOS = 2
VOCAB = 1000


@dataclass(frozen=True, slots=True)
class Spec:
    """One request of a stream: added at driver tick `arrival`."""

    arrival: int
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int = 0
    eos_at: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class Setup:
    block_size: int = 4
    num_blocks: int = 64
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    max_model_len: int = 64
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    watermark: float = 0.0
    async_scheduling: bool = False


def fake_token(rid: str, i: int, spec: Spec) -> int:
    """The token a request samples at output position i."""
    if spec.eos_at is not None and i == spec.eos_at:
        return EOS
    h = (sum(map(ord, rid)) * 1_000_003 + i * 2_654_435_761) % (VOCAB - 3)
    return 3 + h


def fake_sampled(requests: dict[str, Any], ids: list[str], specs: dict[str, Spec]) -> list[list[int]]:
    """One fake token per scheduled request, none for a partial prefill chunk: both schedulers' model."""
    return [[] if (req := requests[rid]).is_prefill_chunk
            else [fake_token(rid, req.num_computed_tokens - req.num_prompt_tokens, specs[rid])] for rid in ids]


@dataclass(slots=True)
class TickLog:
    tick: int
    scheduled: list[tuple[str, int]] | None = None
    preempted: list[str] | None = None
    blocks: dict[str, list[int]] | None = None
    finished: list[tuple[str, str]] | None = None

    def row(self) -> tuple:
        return (self.tick, self.scheduled, self.preempted, self.blocks, self.finished)


def schedule_tick(sched: Any, specs: dict[str, Spec],
                  block_ids: Callable[[str], list[int]]) -> tuple[Any, list[str], list[list[int]], TickLog]:
    """One `schedule()` of either side's scheduler: its output, the ids it scheduled (in order), the fake
    tokens they sample, and the tick's log, with each request's block ids as `block_ids` reads them
    (requests holding none left out)."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    sampled = fake_sampled(sched.requests, ids, specs)
    blocks = {rid: b for rid in sched.requests if (b := block_ids(rid))}
    log = TickLog(0, list(so.num_scheduled_tokens.items()), sorted(so.preempted_req_ids), blocks)
    return so, ids, sampled, log


# ---- vLLM's side ---------------------------------------------------------------------------------
class _VllmModule:
    """vLLM's classes and one VllmConfig, built once (ModelConfig alone takes seconds)."""

    def __init__(self) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        self.Scheduler, self.AsyncScheduler = Scheduler, AsyncScheduler
        self.KVCacheConfig, self.KVCacheGroupSpec, self.FullAttentionSpec = KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec
        self.ModelRunnerOutput, self.Request, self.SamplingParams = ModelRunnerOutput, Request, SamplingParams
        self.StructuredOutputManager = StructuredOutputManager
        self.get_request_block_hasher = get_request_block_hasher
        self.hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(self.hash_fn)
        self.model_dir = tempfile.mkdtemp(prefix="stepscope-vllm-")
        with open(os.path.join(self.model_dir, "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                       "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
                       "num_hidden_layers": 1, "vocab_size": VOCAB, "max_position_embeddings": 8192,
                       "torch_dtype": "float32"}, f)
        model_config = ModelConfig(model=self.model_dir, tokenizer=None, skip_tokenizer_init=True,
                                   dtype="float32", max_model_len=1024)
        cache_config = CacheConfig(block_size=16, enable_prefix_caching=True)
        cache_config.num_gpu_blocks = 64
        scheduler_config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=1024,
                                           enable_chunked_prefill=True, is_encoder_decoder=False,
                                           async_scheduling=False)
        self.vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                                      cache_config=cache_config)

    def scheduler(self, s: Setup) -> Any:
        """A fresh vLLM scheduler for `s`: the shared config's fields are set, then read by the constructor."""
        vc = self.vllm_config
        vc.model_config.max_model_len = s.max_model_len
        sc = vc.scheduler_config
        for name, value in (("max_num_seqs", s.max_num_seqs), ("max_num_batched_tokens", s.max_num_batched_tokens),
                            ("max_model_len", s.max_model_len), ("enable_chunked_prefill", s.enable_chunked_prefill),
                            ("long_prefill_token_threshold", s.long_prefill_token_threshold),
                            ("policy", s.policy), ("watermark", s.watermark),
                            ("async_scheduling", s.async_scheduling)):
            object.__setattr__(sc, name, value)
        cc = vc.cache_config
        object.__setattr__(cc, "block_size", s.block_size)
        object.__setattr__(cc, "enable_prefix_caching", s.enable_prefix_caching)
        object.__setattr__(cc, "num_gpu_blocks", s.num_blocks)
        kv = self.KVCacheConfig(num_blocks=s.num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            self.KVCacheGroupSpec(["layer.0"], self.FullAttentionSpec(
                block_size=s.block_size, num_kv_heads=1, head_size=1, dtype=self.torch.float32))])
        cls = self.AsyncScheduler if s.async_scheduling else self.Scheduler
        return cls(vllm_config=vc, kv_cache_config=kv, block_size=s.block_size, log_stats=True,
                   structured_output_manager=self.StructuredOutputManager(vc))


_VLLM: _VllmModule | None = None


def vllm_module() -> _VllmModule:
    global _VLLM
    if _VLLM is None:
        _VLLM = _VllmModule()
    return _VLLM


class VllmSide:
    def __init__(self, setup: Setup) -> None:
        self.m = vllm_module()
        self.setup = setup
        self.sched = self.m.scheduler(setup)
        self.specs: dict[str, Spec] = {}
        self.hasher = self.m.get_request_block_hasher(setup.block_size, self.m.hash_fn)

    def add(self, rid: str, spec: Spec) -> None:
        params = self.m.SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos, temperature=0.0)
        params.update_from_generation_config({}, eos_token_id=EOS)
        req = self.m.Request(rid, list(spec.prompt), params, None, arrival_time=float(spec.arrival),
                             priority=spec.priority, block_hasher=self.hasher)
        self.specs[rid] = spec
        self.sched.add_request(req)

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def _block_ids(self, rid: str) -> list[int]:
        """The request's block ids in the one KV cache group."""
        groups = self.sched.kv_cache_manager.get_block_ids(rid)
        return groups[0] if groups else []

    def schedule(self) -> tuple[Any, Any, TickLog]:
        so, ids, sampled, log = schedule_tick(self.sched, self.specs, self._block_ids)
        return so, self.m.ModelRunnerOutput(ids, {rid: i for i, rid in enumerate(ids)}, sampled), log

    def update(self, so: Any, out: Any) -> list[tuple[str, str]]:
        finished = []
        for eco in self.sched.update_from_output(so, out).values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append((o.request_id, str(o.finish_reason)))
        return sorted(finished)


# ---- engine.core's side --------------------------------------------------------------------------
class OurSide:
    def __init__(self, setup: Setup) -> None:
        from engine.core import CacheConfig, SchedulerConfig, make_scheduler

        sc = SchedulerConfig(max_model_len=setup.max_model_len, max_num_seqs=setup.max_num_seqs,
                             max_num_batched_tokens=setup.max_num_batched_tokens,
                             enable_chunked_prefill=setup.enable_chunked_prefill,
                             long_prefill_token_threshold=setup.long_prefill_token_threshold, policy=setup.policy,
                             async_scheduling=setup.async_scheduling)
        cc = CacheConfig(block_size=setup.block_size, num_gpu_blocks=setup.num_blocks,
                         enable_prefix_caching=setup.enable_prefix_caching, watermark=setup.watermark)
        self.sched = make_scheduler(sc, cc, clock=lambda: 0.0)
        self.specs: dict[str, Spec] = {}

    def add(self, rid: str, spec: Spec) -> None:
        from engine.core import Request, SamplingParams

        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=spec.ignore_eos, temperature=0.0)
        self.specs[rid] = spec
        self.sched.add_request(Request(rid, list(spec.prompt), params, eos_token_id=EOS,
                                       arrival_time=float(spec.arrival), priority=spec.priority))

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def schedule(self) -> tuple[Any, Any, TickLog]:
        from engine.core import ModelRunnerOutput

        so, ids, sampled, log = schedule_tick(self.sched, self.specs, self.sched.kv_cache_manager.get_block_ids)
        return so, ModelRunnerOutput(ids, sampled), log

    def update(self, so: Any, out: Any) -> list[tuple[str, str]]:
        outs = self.sched.update_from_output(so, out)
        return sorted((o.request_id, o.finish_reason) for o in outs.outputs if o.finish_reason is not None)


# ---- the driver ----------------------------------------------------------------------------------
@dataclass(slots=True)
class Run:
    logs: list[TickLog] = field(default_factory=list)
    error: str | None = None


def drive(side: VllmSide | OurSide, specs: list[Spec], async_scheduling: bool, max_ticks: int = 2000) -> Run:
    """Feed `specs` to one side tick by tick, as vLLM's engine core loop does; log every tick."""
    run = Run()
    by_tick: dict[int, list[tuple[str, Spec]]] = {}
    for i, s in enumerate(specs):
        by_tick.setdefault(s.arrival, []).append((f"r{i}", s))
    last_arrival = max(by_tick, default=0)
    queue: deque = deque()
    try:
        for tick in range(max_ticks):
            for rid, s in by_tick.get(tick, ()):
                side.add(rid, s)
            log = TickLog(tick)
            if not async_scheduling:
                if side.has_requests():
                    so, out, sl = side.schedule()
                    log.scheduled, log.preempted, log.blocks = sl.scheduled, sl.preempted, sl.blocks
                    log.finished = side.update(so, out)
                elif tick > last_arrival:
                    return run
            else:
                popped = False
                if side.has_requests():
                    so, out, sl = side.schedule()
                    log.scheduled, log.preempted, log.blocks = sl.scheduled, sl.preempted, sl.blocks
                    queue.appendleft((so, out))
                    if len(queue) < 2 and (so.total_num_scheduled_tokens > 0 or side.has_requests()):
                        popped = True
                elif not queue:
                    if tick > last_arrival:
                        return run
                    popped = True
                if not popped:
                    so, out = queue.pop()
                    log.finished = side.update(so, out)
            run.logs.append(log)
        run.error = f"did not finish within {max_ticks} ticks"
    except Exception as e:  # a crash on either side is a divergence too
        run.error = f"{type(e).__name__}: {e}"
    return run


def first_divergence(a: Run, b: Run) -> str | None:
    """None when both runs logged the same ticks; else the first differing tick, both sides."""
    for la, lb in zip(a.logs, b.logs):
        if la.row() != lb.row():
            return f"tick {la.tick}:\n  vllm:   {la.row()}\n  ours:   {lb.row()}"
    if len(a.logs) != len(b.logs) or a.error != b.error:
        n = min(len(a.logs), len(b.logs))
        return (f"after tick {n}: vllm ran {len(a.logs)} ticks (error {a.error}), ours ran {len(b.logs)} ticks "
                f"(error {b.error})")
    return None


def compare(setup: Setup, specs: list[Spec]) -> tuple[str | None, int]:
    """Run both sides; returns (first divergence or None, ticks compared)."""
    a = drive(VllmSide(setup), specs, setup.async_scheduling)
    b = drive(OurSide(setup), specs, setup.async_scheduling)
    return first_divergence(a, b), min(len(a.logs), len(b.logs))


# ---- hypothesis strategies -----------------------------------------------------------------------
def streams(async_scheduling: bool = False):
    """A Setup and a request stream: tight pools, small budgets, shared prefixes, both policies."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        bs = draw(st.sampled_from([2, 4, 8]))
        max_model_len = draw(st.integers(4, 24)) * bs
        min_blocks = -(-max_model_len // bs) + 1
        num_blocks = draw(st.integers(min_blocks, min_blocks + 24))
        chunked = draw(st.booleans())
        budget = draw(st.integers(1, 48)) if chunked else max_model_len + draw(st.integers(0, 16))
        setup = Setup(block_size=bs, num_blocks=num_blocks, max_num_seqs=draw(st.integers(1, 6)),
                      max_num_batched_tokens=budget, max_model_len=max_model_len,
                      enable_prefix_caching=draw(st.booleans()), enable_chunked_prefill=chunked,
                      long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8, 16])),
                      policy=draw(st.sampled_from(["fcfs", "priority"])),
                      watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])), async_scheduling=async_scheduling)
        groups = [tuple(draw(st.lists(st.integers(3, VOCAB - 1), min_size=bs, max_size=3 * bs)))
                  for _ in range(draw(st.integers(0, 2)))]
        specs = []
        for _ in range(draw(st.integers(1, 8))):
            prefix = draw(st.sampled_from(groups)) if groups and draw(st.booleans()) else ()
            tail = tuple(draw(st.lists(st.integers(3, VOCAB - 1), min_size=0 if prefix else 1, max_size=3 * bs)))
            prompt = (prefix + tail)[:max_model_len - 1]
            max_tokens = draw(st.integers(1, 24))
            eos_at = draw(st.none() | st.integers(0, max_tokens))
            specs.append(Spec(arrival=draw(st.integers(0, 12)), prompt=prompt, max_tokens=max_tokens,
                              priority=draw(st.integers(0, 2)), eos_at=eos_at, ignore_eos=draw(st.booleans())))
        specs.sort(key=lambda s: s.arrival)
        return setup, specs

    return build()
