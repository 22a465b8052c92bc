"""The model runner: keeps per-request state, flattens a step into one varlen batch, runs the model
and samples. Decodes go first in the batch so attention can treat them as one vectorised group."""
from __future__ import annotations

import logging
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.outputs import LogprobsLists, ModelRunnerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.sched_output import SchedulerOutput
from engine.model_executor.forward_context import AttentionMetadata, set_forward_context
from engine.model_executor.layers.cpu_linear import pack_linears
from engine.model_executor.layers.moe import SparseMoeBlock, routing_counters
from engine.model_executor.layers.sampler import Sampler, SamplerOutput, build_sampling_metadata
from engine.model_executor.loader import KVCacheSpec, kv_cache_spec, load_model
from engine.model_executor.models.llama import LlamaForCausalLM
from engine.worker.cuda_graphs import GRAPH_BACKENDS, DecodeGraphs
from engine.worker.input_batch import BatchInputs, CachedRequestState, build_batch
from engine.worker.model_runner_output import (
    PLACEHOLDER_TOKEN, STEP_OVERLAPS, MoeCounters, PendingStep, PreparedStep, StepOutput, to_device)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

logger = logging.getLogger("stepscope")

# What profiling and warm-up sample with: every sampling knob on, so their buffers are measured too.
_PROFILE_PARAMS = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, min_p=0.05)


def default_step_overlap(async_scheduling: bool, device: torch.device) -> str:
    """Synchronous scheduling runs vLLM's split. Async scheduling launches each step without waiting,
    which overlaps through the CUDA stream; a CPU runs the same code with nothing overlapping rather than
    in a worker thread ("thread"): the forward of a small model is mostly Python, so two threads take
    turns on the GIL (bench/async_scheduling.py compares all three)."""
    return "launch" if async_scheduling else "none"


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.dtype = _DTYPES[config.model_config.dtype]
        self.kv_dtype = getattr(torch, config.model_config.kv_dtype)  # the model's dtype, or fp8 storage
        self.block_size = config.cache_config.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler()
        self.model: LlamaForCausalLM | None = None
        self.moe_blocks: list[SparseMoeBlock] = []  # a MoE model's sparse blocks, whose routing each step counts
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: DecodeGraphs | None = None
        # Launched steps whose tokens `sample_tokens` has not collected yet, oldest first.
        self._pending: deque[PendingStep] = deque()
        sc = config.scheduler_config
        self._batch_queue_size = 2 if sc.async_scheduling else 1
        self.step_overlap = default_step_overlap(sc.async_scheduling, device)
        # Request id -> row of the last launched step's sampled ids (host side, for the next step's inputs).
        self._last_sample_rows: dict[str, int] = {}
        # The last step's sampled ids on the device; read and written only where steps run (see _forward).
        self._prev_sampled: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None

    # ---- start-up --------------------------------------------------------------------------------
    def _loaded_model(self) -> LlamaForCausalLM:
        if self.model is None:
            raise RuntimeError("ModelRunner: load_model() must come first")
        return self.model

    def load_model(self) -> None:
        mc = self.config.model_config
        model = load_model(mc.hf_config, mc.model_dir, mc.load_format, self.dtype, self.device, mc.seed,
                           attn_backend=self.config.device_config.attention_backend)
        self.model = model
        self.moe_blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        if self.device.type == "cpu":
            packing = pack_linears(model, batch_size_hint=self.config.scheduler_config.max_num_seqs)
            if packing.upcast:
                logger.info("%d linear layers in %s multiply in float32: oneDNN has no kernel for that dtype on "
                            "this CPU (bf16 needs AVX-512 or AVX-NE-CONVERT)", packing.upcast, self.dtype)

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return kv_cache_spec(self.config.model_config.hf_config)

    def get_kv_bytes_per_block(self) -> int:
        """What one block id costs in the KV pool, in the cache's dtype: the engine core sizes the pool with it."""
        from engine.model_executor.loader import kv_bytes_per_block

        return kv_bytes_per_block(self.get_kv_cache_spec(), self.block_size, self.kv_dtype)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A worst-case forward without KV cache (a full token budget, split into max_model_len
        sequences) plus sampling for max_num_seqs rows, to measure peak activation memory."""
        sc = self.config.scheduler_config
        model, max_len = self._loaded_model(), sc.max_model_len
        total = min(sc.token_budget, max_len * sc.max_num_seqs)
        lens = [max_len] * (total // max_len) + ([total % max_len] if total % max_len else [])
        qsl = np.concatenate([[0], np.cumsum(lens)]).tolist()
        ids = torch.zeros(total, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        meta = AttentionMetadata(total, torch.full((total,), -1, dtype=torch.long, device=self.device),
                                 torch.tensor(qsl, dtype=torch.int32, device=self.device),
                                 torch.tensor(lens, dtype=torch.int32, device=self.device),
                                 torch.zeros((len(lens), 1), dtype=torch.int32, device=self.device),
                                 max(lens), max(lens), 0, 0, qsl, lens)
        with set_forward_context(meta):
            hidden = model(ids, pos)
        rows = min(sc.max_num_seqs, total)
        logits = model.compute_logits(hidden[:rows])
        self.sampler(logits, build_sampling_metadata([_PROFILE_PARAMS] * rows, {}, self.device))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One (2, num_blocks, block_size, kv_heads, head_size) tensor per layer, bound to its layer.

        The backend is chosen again here, now that block size, dtype and head size are all known
        (flash-attn, for one, needs large blocks and reads no fp8 cache)."""
        from engine.model_executor.attention import get_attn_backend

        spec = self.get_kv_cache_spec()
        backend = get_attn_backend(self.config.device_config.attention_backend, self.device,
                                   block_size=self.block_size, dtype=self.kv_dtype, head_size=spec.head_size)
        layers = self._loaded_model().attention_layers()
        shape = backend.get_kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads, spec.head_size)
        self.kv_caches = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in layers]
        for layer, cache in zip(layers, self.kv_caches):
            layer.backend = backend
            layer.kv_cache = cache

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run a tiny paged step through block 0 (the null block, never read for real requests).

        On a CPU the C kernels are loaded here too (built the first time on a machine), so no step of a
        run pays for it."""
        if self.device.type == "cpu" and self.dtype == torch.float32:
            from engine.model_executor.attention import cpu_native
            from engine.model_executor.layers import cpu_ops

            cpu_native.load()
            cpu_ops.load()
        n = min(4, self.block_size)
        state = CachedRequestState("warmup", [0] * n, n, _PROFILE_PARAMS, [0], 0, None, None)
        batch = build_batch([state], [n], self.block_size)
        with set_forward_context(self._metadata(batch)):
            self._loaded_model()(*self._inputs(batch))

    def capture_cudagraphs(self) -> bool:
        """Capture decode graphs on CUDA unless --enforce-eager or the backend syncs with the host."""
        model = self._loaded_model()
        backend = model.attention_layers()[0].backend.name
        if self.device.type != "cuda" or self.config.device_config.enforce_eager or backend not in GRAPH_BACKENDS:
            return False
        sc = self.config.scheduler_config
        self.graphs = DecodeGraphs(model, self.device, sc.max_num_seqs, sc.max_model_len, self.block_size)
        self.graphs.capture()
        return True

    # ---- one step --------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
        for new in so.scheduled_new_reqs:
            params = new.sampling_params
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.prompt_token_ids), len(new.prompt_token_ids), params, list(new.block_ids),
                new.num_computed_tokens, new.eos_token_id, gen)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = self.requests[rid]
            if cached.resumed_from_preemption[i]:
                token_ids = cached.resumed_token_ids[i]
                if token_ids is None:
                    raise RuntimeError(f"request {rid}: resumed after preemption without its token ids")
                state.token_ids = list(token_ids)
                state.block_ids = list(cached.new_block_ids[i])
            else:
                state.block_ids.extend(cached.new_block_ids[i])
            state.num_computed_tokens = cached.num_computed_tokens[i]

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> None:
        """Prepare the step on the host and launch it (see model_runner_output for the three ways);
        its tokens are collected, oldest first, by `sample_tokens`."""
        self._update_states(so)
        # A step whose `sample_tokens` never came (its caller failed it first) is dropped here: with a
        # batch queue of n, at most n - 1 older steps can still be waiting for theirs.
        while len(self._pending) >= self._batch_queue_size:
            self._pending.popleft()
        if so.total_num_scheduled_tokens == 0:
            self._pending.append(PendingStep(None))
            return
        prep = self._prepare(so)
        if self.step_overlap == "thread":
            self._pending.append(PendingStep(prep, future=self._worker_thread().submit(self._launch, prep)))
        elif self.step_overlap == "launch":
            self._pending.append(PendingStep(prep, output=self._launch(prep)))
        else:
            for pending in self._pending:  # async scheduling: the previous step's tokens feed this one
                self._sample_pending(pending)
            self._pending.append(PendingStep(prep, logits=self._forward(prep)))

    @torch.inference_mode()
    def sample_tokens(self) -> ModelRunnerOutput:
        """The oldest launched step's tokens, once on the host; they replace its placeholders here too."""
        pending = self._pending.popleft()
        prep = pending.prep
        if prep is None:
            return ModelRunnerOutput([], [])
        if pending.future is not None:
            pending.output = pending.future.result()
        else:
            self._sample_pending(pending)
            if pending.error is not None:
                raise pending.error
        batch = prep.batch
        sampled: list[list[int]] = [[] for _ in batch.req_ids]
        moe = None if prep.moe is None else prep.moe.to_host()
        if pending.output is None:
            return ModelRunnerOutput(batch.req_ids, sampled, moe_stats=moe)
        tokens, lp = pending.output.to_host()
        for row, (token_ids, index), tok in zip(batch.sample_rows, prep.slots, tokens):
            token_ids[index] = tok
            sampled[row] = [tok]
        logprobs = None
        if lp is not None:
            ids, lps, ranks = lp
            logprobs = {rid: LogprobsLists([ids[i][:k + 1]], [lps[i][:k + 1]], [ranks[i]])
                        for i, rid, k in prep.logprob_reqs}
        return ModelRunnerOutput(batch.req_ids, sampled, logprobs, moe)

    def _prepare(self, so: SchedulerOutput) -> PreparedStep:
        """The step's host work: flatten the batch, send its inputs to the device, and mark each token
        this step samples as a placeholder in its request's list until the host has it."""
        # Decodes first (attention treats them as one group), ordered by context length so that
        # neighbours need similar padding.
        reqs = self.requests
        items = sorted(so.num_scheduled_tokens.items(),
                       key=lambda kv: (kv[1] != 1, reqs[kv[0]].num_computed_tokens))
        states = [reqs[rid] for rid, _ in items]
        batch = build_batch(states, [n for _, n in items], self.block_size)
        placeholders = self._placeholder_sources(batch)
        dev = self.device
        graph = self.graphs is not None and self.graphs.can_run(len(batch.input_ids), batch.num_decodes == len(states))
        prep = PreparedStep(
            batch, to_device(batch.input_ids, dev), to_device(batch.positions, dev),
            placeholders, None if graph else self._metadata(batch),
            (to_device(batch.slot_mapping, dev), to_device(np.asarray(batch.seq_lens, dtype=np.int32), dev),
             to_device(batch.block_table, dev)) if graph else None,
            None, None, [])
        rows = batch.sample_rows
        if rows:
            prep.logits_index = to_device(np.cumsum(batch.query_lens)[rows] - 1, dev)
            sample_states = [states[r] for r in rows]
            gens = {i: s.generator for i, s in enumerate(sample_states) if s.generator is not None}
            prep.sampling = build_sampling_metadata([s.sampling_params for s in sample_states], gens, "cpu")
            if dev.type != "cpu":
                meta = prep.sampling
                meta.temperature, meta.top_p, meta.top_k, meta.min_p = (
                    None if t is None else to_device(t, dev) for t in (meta.temperature, meta.top_p, meta.top_k,
                                                                       meta.min_p))
            for i, (r, s) in enumerate(zip(rows, sample_states)):
                p = s.sampling_params
                if p.min_tokens and batch.seq_lens[r] - s.num_prompt_tokens < p.min_tokens:
                    banned = list(p.stop_token_ids) + ([s.eos_token_id] if s.eos_token_id is not None else [])
                    if banned:
                        prep.banned.append((i, banned))
                if p.logprobs is not None:
                    prep.logprob_reqs.append((i, s.req_id, p.logprobs))
                s.token_ids.append(PLACEHOLDER_TOKEN)
                prep.slots.append((s.token_ids, len(s.token_ids) - 1))
        self._last_sample_rows = {batch.req_ids[r]: i for i, r in enumerate(rows)}
        return prep

    def _placeholder_sources(self, batch: BatchInputs) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Batch positions fed by the previous step's sampled ids, and that step's rows for them.

        A placeholder the previous step does not sample can only be left by a step that failed, whose
        requests are being ended; it gets token 0, so the rest of the batch still runs."""
        positions = np.flatnonzero(batch.input_ids == PLACEHOLDER_TOKEN)
        if not len(positions):
            return None
        owner = np.searchsorted(np.cumsum(batch.query_lens), positions, side="right")
        prev_rows = self._last_sample_rows
        src = np.array([prev_rows.get(batch.req_ids[i], -1) for i in owner], dtype=np.int64)
        batch.input_ids[positions[src < 0]] = 0
        keep = src >= 0
        if not keep.any():
            return None
        return to_device(positions[keep], self.device), to_device(src[keep], self.device)

    def _forward(self, prep: PreparedStep) -> torch.Tensor | None:
        """Device work up to the logits of the rows that sample."""
        prev, self._prev_sampled = self._prev_sampled, None
        ids, model = prep.input_ids, self._loaded_model()
        if prep.placeholders is not None:
            dst, src = prep.placeholders
            if prev is None:  # the step that samples them failed: its requests are ended, see above
                ids.index_fill_(0, dst, 0)
            else:
                ids.index_copy_(0, dst, prev.index_select(0, src))
        if prep.graph_inputs is not None:
            if self.graphs is None:
                raise RuntimeError("a step prepared for a CUDA graph, but no graphs were captured")
            hidden = self.graphs.run(ids, prep.positions, *prep.graph_inputs)
        else:
            with set_forward_context(prep.metadata):
                hidden = model(ids, prep.positions)
        if self.moe_blocks:
            prep.moe = MoeCounters(routing_counters(self.moe_blocks), len(self.moe_blocks))
        return None if prep.logits_index is None else model.compute_logits(hidden[prep.logits_index])

    def _sample(self, prep: PreparedStep, logits: torch.Tensor | None) -> StepOutput | None:
        if logits is None or prep.sampling is None:  # both are there exactly when a row samples
            return None
        for row, banned in prep.banned:  # vLLM's min-tokens rule: no EOS or stop token before min_tokens
            logits[row, banned] = float("-inf")
        out: SamplerOutput = self.sampler(logits, prep.sampling)
        self._prev_sampled = out.sampled_token_ids
        return StepOutput(out, self.device)

    @torch.inference_mode()
    def _launch(self, prep: PreparedStep) -> StepOutput | None:
        """Forward and sampling queued together ("launch"; in the worker thread for "thread")."""
        return self._sample(prep, self._forward(prep))

    def _sample_pending(self, pending: PendingStep) -> None:
        """Run a "none" step's sampling once; an error stays with that step, for its own `sample_tokens`."""
        if pending.sampled or pending.prep is None or pending.future is not None or pending.output is not None:
            return
        pending.sampled = True
        logits, pending.logits = pending.logits, None
        try:
            pending.output = self._sample(pending.prep, logits)
        except Exception as e:
            self._prev_sampled = None
            pending.error = e

    def _worker_thread(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="stepscope-model")
            weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def set_step_overlap(self, mode: str) -> None:
        """Choose how steps are launched (STEP_OVERLAPS); only between steps."""
        if mode not in STEP_OVERLAPS:
            raise ValueError(f"step overlap: one of {STEP_OVERLAPS}, got {mode!r}")
        if mode == "thread" and self.device.type != "cpu":
            raise ValueError("step overlap 'thread' is for CPUs; CUDA overlaps through its stream ('launch')")
        if self._pending:
            raise RuntimeError("step overlap can only change while no step is in flight")
        self.step_overlap = mode

    def _inputs(self, batch: BatchInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return to_device(batch.input_ids, self.device), to_device(batch.positions, self.device)

    def _metadata(self, batch: BatchInputs) -> AttentionMetadata:
        qsl = [0]
        for q in batch.query_lens:
            qsl.append(qsl[-1] + q)
        dev = self.device
        return AttentionMetadata(
            num_actual_tokens=qsl[-1],
            slot_mapping=to_device(batch.slot_mapping, dev),
            query_start_loc=to_device(np.asarray(qsl, dtype=np.int32), dev),
            seq_lens=to_device(np.asarray(batch.seq_lens, dtype=np.int32), dev),
            block_tables=to_device(batch.block_table, dev),
            max_query_len=max(batch.query_lens), max_seq_len=max(batch.seq_lens),
            num_decodes=batch.num_decodes, num_decode_tokens=batch.num_decodes,
            query_start_loc_cpu=qsl, seq_lens_cpu=batch.seq_lens)
