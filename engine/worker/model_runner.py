"""The model runner: keeps per-request state, flattens a step into one varlen batch, runs the model
and samples. Decodes go first in the batch so attention can treat them as one vectorised group."""
from __future__ import annotations

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.outputs import LogprobsLists, ModelRunnerOutput
from engine.core.sched_output import SchedulerOutput
from engine.model_executor.forward_context import AttentionMetadata, set_forward_context
from engine.model_executor.layers.cpu_linear import pack_linears
from engine.model_executor.layers.sampler import Sampler, build_sampling_metadata
from engine.model_executor.loader import KVCacheSpec, kv_cache_spec, load_model
from engine.worker.cuda_graphs import GRAPH_BACKENDS, DecodeGraphs
from engine.worker.input_batch import BatchInputs, CachedRequestState, build_batch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.dtype = _DTYPES[config.model_config.dtype]
        self.block_size = config.cache_config.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler()
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self._pending: tuple[BatchInputs, torch.Tensor | None] | None = None
        self.graphs: DecodeGraphs | None = None

    # ---- start-up --------------------------------------------------------------------------------
    def load_model(self) -> None:
        mc = self.config.model_config
        self.model = load_model(mc.hf_config, mc.model_dir, mc.load_format, self.dtype, self.device, mc.seed,
                                attn_backend=self.config.device_config.attention_backend)
        if self.device.type == "cpu":
            pack_linears(self.model, batch_size_hint=self.config.scheduler_config.max_num_seqs)

    def get_kv_cache_spec(self) -> KVCacheSpec:
        return kv_cache_spec(self.config.model_config.hf_config)

    def get_kv_bytes_per_block(self) -> int:
        """What one block id costs in the KV pool, in this runner's dtype: the engine core sizes the pool with it."""
        from engine.model_executor.loader import kv_bytes_per_block

        return kv_bytes_per_block(self.get_kv_cache_spec(), self.block_size, self.dtype)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A worst-case forward without KV cache (a full token budget, split into max_model_len
        sequences) plus sampling for max_num_seqs rows, to measure peak activation memory."""
        sc = self.config.scheduler_config
        total = min(sc.max_num_batched_tokens, sc.max_model_len * sc.max_num_seqs)
        lens = [sc.max_model_len] * (total // sc.max_model_len) + ([total % sc.max_model_len] if total % sc.max_model_len else [])
        qsl = np.concatenate([[0], np.cumsum(lens)]).tolist()
        ids = torch.zeros(total, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])
        meta = AttentionMetadata(total, torch.full((total,), -1, dtype=torch.long, device=self.device),
                                 torch.tensor(qsl, dtype=torch.int32, device=self.device),
                                 torch.tensor(lens, dtype=torch.int32, device=self.device),
                                 torch.zeros((len(lens), 1), dtype=torch.int32, device=self.device),
                                 max(lens), max(lens), 0, 0, qsl, lens)
        with set_forward_context(meta):
            hidden = self.model(ids, pos)
        rows = min(sc.max_num_seqs, total)
        logits = self.model.compute_logits(hidden[:rows])
        self.sampler(logits, build_sampling_metadata([_PROFILE_PARAMS] * rows, {}, self.device))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One (2, num_blocks, block_size, kv_heads, head_size) tensor per layer, bound to its layer.

        The backend is chosen again here, now that block size, dtype and head size are all known
        (flash-attn, for one, needs large blocks)."""
        from engine.model_executor.attention import get_attn_backend

        spec = self.get_kv_cache_spec()
        backend = get_attn_backend(self.config.device_config.attention_backend, self.device,
                                   block_size=self.block_size, dtype=self.dtype, head_size=spec.head_size)
        layers = self.model.attention_layers()
        shape = backend.get_kv_cache_shape(num_blocks, self.block_size, spec.num_kv_heads, spec.head_size)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in layers]
        for layer, cache in zip(layers, self.kv_caches):
            layer.backend = backend
            layer.kv_cache = cache

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run a tiny paged step through block 0 (the null block, never read for real requests)."""
        n = min(4, self.block_size)
        state = CachedRequestState("warmup", [0] * n, n, _PROFILE_PARAMS, [0], 0, None, None)
        batch = build_batch([state], [n], self.block_size)
        with set_forward_context(self._metadata(batch)):
            self.model(*self._inputs(batch))

    def capture_cudagraphs(self) -> bool:
        """Capture decode graphs on CUDA unless --enforce-eager or the backend syncs with the host."""
        backend = self.model.attention_layers()[0].backend.name
        if self.device.type != "cuda" or self.config.device_config.enforce_eager or backend not in GRAPH_BACKENDS:
            return False
        sc = self.config.scheduler_config
        self.graphs = DecodeGraphs(self.model, self.device, sc.max_num_seqs, sc.max_model_len, self.block_size)
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
                state.token_ids = list(cached.resumed_token_ids[i])
                state.block_ids = list(cached.new_block_ids[i])
            else:
                state.block_ids.extend(cached.new_block_ids[i])
            state.num_computed_tokens = cached.num_computed_tokens[i]

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> None:
        """Run the forward for the step; logits of the rows that sample wait for `sample_tokens`."""
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            self._pending = None
            return
        # Decodes first (attention treats them as one group), ordered by context length so that
        # neighbours need similar padding.
        reqs = self.requests
        items = sorted(so.num_scheduled_tokens.items(),
                       key=lambda kv: (kv[1] != 1, reqs[kv[0]].num_computed_tokens))
        states = [reqs[rid] for rid, _ in items]
        batch = build_batch(states, [n for _, n in items], self.block_size)
        num_tokens = len(batch.input_ids)
        if self.graphs is not None and self.graphs.can_run(num_tokens, batch.num_decodes == len(states)):
            hidden = self.graphs.run(batch.input_ids, batch.positions, batch.slot_mapping, batch.seq_lens,
                                     batch.block_table)
        else:
            with set_forward_context(self._metadata(batch)):
                hidden = self.model(*self._inputs(batch))
        logits = None
        if batch.sample_rows:
            last = np.cumsum(batch.query_lens)[batch.sample_rows] - 1
            logits = self.model.compute_logits(hidden[torch.from_numpy(last).to(self.device)])
        self._pending = (batch, logits)

    @torch.inference_mode()
    def sample_tokens(self) -> ModelRunnerOutput:
        if self._pending is None:
            return ModelRunnerOutput([], [])
        batch, logits = self._pending
        self._pending = None
        sampled: list[list[int]] = [[] for _ in batch.req_ids]
        if logits is None:
            return ModelRunnerOutput(batch.req_ids, sampled)
        states = [self.requests[batch.req_ids[r]] for r in batch.sample_rows]
        self._mask_stop_tokens_before_min_tokens(logits, states)
        gens = {i: s.generator for i, s in enumerate(states) if s.generator is not None}
        out = self.sampler(logits, build_sampling_metadata([s.sampling_params for s in states], gens, self.device))
        tokens = out.sampled_token_ids.tolist()
        logprobs = self._logprobs(out, states) if out.logprobs is not None else None
        for row, state, tok in zip(batch.sample_rows, states, tokens):
            state.token_ids.append(tok)
            sampled[row] = [tok]
        return ModelRunnerOutput(batch.req_ids, sampled, logprobs)

    @staticmethod
    def _mask_stop_tokens_before_min_tokens(logits: torch.Tensor, states: list[CachedRequestState]) -> None:
        """Until min_tokens are out, EOS and stop token ids cannot be sampled (vLLM's min-tokens rule)."""
        for row, s in enumerate(states):
            p = s.sampling_params
            if p.min_tokens and s.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids) + ([s.eos_token_id] if s.eos_token_id is not None else [])
                if banned:
                    logits[row, banned] = float("-inf")

    @staticmethod
    def _logprobs(out, states: list[CachedRequestState]) -> dict[str, LogprobsLists]:
        ids, lps, ranks = out.logprob_token_ids.tolist(), out.logprobs.tolist(), out.ranks.tolist()
        result = {}
        for i, s in enumerate(states):
            k = s.sampling_params.logprobs
            if k is not None:
                result[s.req_id] = LogprobsLists([ids[i][:k + 1]], [lps[i][:k + 1]], [ranks[i]])
        return result

    def _inputs(self, batch: BatchInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(batch.input_ids).to(self.device, non_blocking=True),
                torch.from_numpy(batch.positions).to(self.device, non_blocking=True))

    def _metadata(self, batch: BatchInputs) -> AttentionMetadata:
        qsl = [0]
        for q in batch.query_lens:
            qsl.append(qsl[-1] + q)
        dev = self.device
        return AttentionMetadata(
            num_actual_tokens=qsl[-1],
            slot_mapping=torch.from_numpy(batch.slot_mapping).to(dev, non_blocking=True),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.from_numpy(batch.block_table).to(dev, non_blocking=True),
            max_query_len=max(batch.query_lens), max_seq_len=max(batch.seq_lens),
            num_decodes=batch.num_decodes, num_decode_tokens=batch.num_decodes,
            query_start_loc_cpu=qsl, seq_lens_cpu=batch.seq_lens)


class _ProfileParams:
    temperature, top_p, top_k, min_p, logprobs, min_tokens, seed = 1.0, 0.9, 50, 0.05, None, 0, None


_PROFILE_PARAMS = _ProfileParams()
