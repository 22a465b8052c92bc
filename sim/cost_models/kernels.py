"""A step as the kernels one GPU rank runs for it, written once for every per-kernel cost model.

vLLM runs a decoder step as: the embedding gather, then per layer two RMS norms, the QKV projection,
(Qwen3) the q/k norms, rotary embedding, one attention call over the whole mixed batch, the output
projection, the gated MLP (gate_up, activation, down), then the final norm, the LM head on each
sequence's last token and the sampler. Under tensor parallelism each rank runs the same kernels on its
shard, and two all-reduces per layer (after o_proj and after down_proj) join the ranks.

A mixture of experts replaces the MLP of its sparse layers by one fused MoE block, whose time follows the
tokens it routes and how many distinct experts they activate on the rank (sim.cost_models.routing).
Under data parallelism the sparse layers are shared by every rank: each all-gathers the hidden states of
all data-parallel ranks' tokens before its experts and reduce-scatters them after (vLLM's all-gather /
reduce-scatter dispatch), so its MoE block runs on the group's tokens while attention runs on its own.

Where the kernel times come from is the `KernelTimes` seam: a measured profile bundle
(`sim.cost_models.profile_bundle`), AIConfigurator's measured databases (`sim.cost_models.aiconfigurator`)
or the per-kernel roofline (`sim.cost_models.roofline`). Each answers for one rank, at the rank's shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sim.cost_models.batch import StepBatch
from sim.cost_models.base import CostModelDefaults, CostModelInfo, StepTiming
from sim.cost_models.hardware import Hardware
from sim.cost_models.model_shape import ModelShape, rank_shape
from sim.cost_models.deployment import Deployment
from sim.cost_models.routing import RoutingModel

if TYPE_CHECKING:
    from sim.cost_models.collectives import MeasuredCollectives

# The ops of one decoder layer, with how many times a layer calls each: attention's side, then the MLP's
# (a sparse layer runs the fused MoE block instead).
ATTENTION_OPS: tuple[tuple[str, int], ...] = (
    ("layernorm", 2), ("qkv_proj", 1), ("qk_norm", 1), ("rotary_emb", 1), ("o_proj", 1))
MLP_OPS: tuple[tuple[str, int], ...] = (("gate_up_proj", 1), ("act_fn", 1), ("down_proj", 1))
LAYER_OPS: tuple[tuple[str, int], ...] = ATTENTION_OPS + MLP_OPS
# Ops run once per step, on every scheduled token.
STEP_OPS: tuple[str, ...] = ("embedding", "final_layernorm")
# Ops run once per step on each sequence's last token (a prefill chunk that samples nothing still pays).
SEQUENCE_OPS: tuple[str, ...] = ("lm_head", "sampler")
DENSE_OPS: tuple[str, ...] = tuple(op for op, _ in LAYER_OPS) + STEP_OPS


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One layer's attention call over a mixed batch, as the profile bundles grid it: one prefill chunk
    of `prefill_chunk` new tokens after `kv_prefill` cached ones, and `n_decode` decodes attending to
    `kv_decode` tokens each (their mean context)."""

    prefill_chunk: int = 0
    kv_prefill: int = 0
    n_decode: int = 0
    kv_decode: int = 0


@dataclass(frozen=True, slots=True)
class MoeCall:
    """One sparse layer's fused MoE block on one rank: `tokens` enter it (every data-parallel rank's under
    data parallelism), the rank runs `activated` distinct experts on `share` of the routed (token, expert)
    pairs, and each of its experts is 1/`width_split` of the model's width (expert tensor parallelism)."""

    tokens: int
    activated: float
    share: float = 1.0
    width_split: int = 1


class KernelTimes(Protocol):
    """Seconds of one rank's kernels at the rank's own shapes (what a TP-N rank multiplies). `outside`
    counts the lookups that fell outside what was measured (0 for a model with no grid)."""

    source: str
    outside: int

    def dense(self, op: str, tokens: int) -> float:
        """One call of a DENSE_OPS op over `tokens` tokens."""
        ...

    def attention(self, shape: AttentionShape) -> float:
        """One layer's attention call."""
        ...

    def per_sequence(self, op: str, sequences: int) -> float:
        """One call of a SEQUENCE_OPS op over `sequences` sequences."""
        ...

    def skew_alpha(self, shape: AttentionShape, kv_min: int, kv_max: int) -> float:
        """How much of t(kv_max) - t(shape) the decodes pay when their contexts span kv_min..kv_max
        rather than all sitting at the mean (0: attention depends on the total context alone)."""
        ...

    def all_reduce_time(self, nbytes: float, tp: int) -> float | None:
        """A measured all-reduce of `nbytes` over `tp` GPUs, or None: priced from the hardware's link."""
        ...

    def moe(self, call: MoeCall) -> float:
        """One sparse layer's fused MoE block (router and routed experts; shared experts where the model has
        them); raises ValueError where the source measured none."""
        ...

    def caveats(self) -> list[str]:
        """What of its source the timer left out (a table marked as not run), one line each."""
        ...

    def describe(self) -> dict[str, Any]: ...


def mean_context(context_tokens: int, num_seqs: int) -> int:
    """The context each of `num_seqs` decodes is priced at: their mean, rounded half to even."""
    return round(context_tokens / num_seqs)


def attention_shapes(batch: StepBatch) -> tuple[AttentionShape, list[AttentionShape]]:
    """The batch's attention as the grid sees it: the largest prefill chunk shares the call with every
    decode (at their mean context); further chunks are priced alone and added."""
    chunks = sorted(batch.prefill_chunks, reverse=True)
    n = batch.num_decode_seqs
    decode_context = batch.context_tokens - sum(c + computed for c, computed in chunks)
    kv_decode = mean_context(decode_context, n) if n else 0
    first = chunks[0] if chunks else (0, 0)
    main = AttentionShape(first[0], first[1], n, kv_decode)
    return main, [AttentionShape(c, computed, 0, 0) for c, computed in chunks[1:]]


class KernelSumCostModel(CostModelDefaults):
    """A step costs the sum of the kernels one rank runs for it, times the layers, plus the all-reduces
    that join the ranks, plus (synchronous scheduling only) the host's time around the step: async
    scheduling prepares step k+1 while step k runs, so the device's time is the step's."""

    def __init__(self, name: str, timer: KernelTimes, shape: ModelShape, hardware: Hardware,
                 deployment: Deployment | None = None, async_scheduling: bool = True) -> None:
        """`shape` is the model as deployed (its dtypes set by `deployment.shape`)."""
        d = deployment or Deployment()
        self.name = name
        self.timer = timer
        self.shape = shape
        self.rank = rank_shape(shape, d.tensor_parallel_size, d.data_parallel_size, d.enable_expert_parallel)
        self.hardware = hardware
        self.tp = d.tensor_parallel_size
        self.dp = d.data_parallel_size
        self.expert_parallel = d.enable_expert_parallel and shape.is_moe
        self.routing: RoutingModel = d.routing_model()
        self.collectives: MeasuredCollectives | None = None
        if self.dp > 1 and shape.is_moe:  # the tables are read only where a data-parallel MoE layer needs them
            from sim.cost_models.collectives import measured_collectives

            self.collectives = measured_collectives(hardware.name)
        self.async_scheduling = async_scheduling
        self._attention_ops = tuple((op, calls) for op, calls in ATTENTION_OPS if op != "qk_norm" or self.rank.qk_norm)
        self._dense_layers = shape.num_layers - shape.num_moe_layers
        self._fixed_cache: dict[tuple[int, int, int], tuple[float, bool]] = {}
        self._floor = timer.attention(AttentionShape(1, 0, 0, 0))
        self.num_steps = 0
        self.steps_outside = 0

    @property
    def max_model_len(self) -> int | None:
        """The model's context length: the simulator's default --max-model-len for workload runs."""
        return self.shape.max_positions or None

    def _fixed(self, tokens: int, seqs: int, moe_tokens: int = 0) -> tuple[float, bool]:
        """Seconds of every kernel but attention (the token-proportional ones and their all-reduces, the
        sparse layers' MoE blocks on `moe_tokens` (0: `tokens`), the LM head, sampler and logits gather) and
        whether all were inside the measured grid: they depend on the step's token and sequence counts
        alone, which recur (every decode batch of one size), so kept."""
        key = (tokens, seqs, moe_tokens)
        hit = self._fixed_cache.get(key)
        if hit is not None:
            return hit
        before = self.timer.outside
        t, shape = self.timer, self.shape
        attention_side = sum(calls * t.dense(op, tokens) for op, calls in self._attention_ops)
        mlp = sum(calls * t.dense(op, tokens) for op, calls in MLP_OPS)
        total = shape.num_layers * attention_side + self._dense_layers * mlp + sum(t.dense(op, tokens) for op in STEP_OPS)
        if shape.is_moe:
            total += shape.num_moe_layers * self.moe_layer(moe_tokens or tokens)
        total += (2 * shape.num_layers + 1) * self.all_reduce(tokens)
        total += sum(t.per_sequence(op, seqs) for op in SEQUENCE_OPS)
        total += self.hardware.gather_time(seqs * self.rank.vocab * shape.dtype_bytes, self.tp)
        hit = self._fixed_cache[key] = (total, self.timer.outside == before)
        return hit

    def moe_call(self, tokens: int) -> MoeCall:
        """What one rank's MoE block runs when `tokens` enter it: under expert parallelism the rank's
        experts and its share of the routed pairs (the busiest rank's, which the others wait for), else
        every expert at its slice of the width."""
        shape, ranks = self.shape, self.tp * self.dp
        ep = ranks if self.expert_parallel else 1
        activated, share = self.routing.rank_load(tokens, shape.router_experts, shape.top_k, ep)
        return MoeCall(tokens, activated, share, 1 if self.expert_parallel else ranks)

    def moe_layer(self, tokens: int) -> float:
        """One sparse layer's MoE block on `tokens` tokens, and under data parallelism the all-gather of
        the group's hidden states before it and the reduce-scatter after."""
        time = self.timer.moe(self.moe_call(tokens))
        if self.dp > 1:
            total = tokens * self.shape.hidden * self.shape.dtype_bytes
            time += self.collective("all_gather", total) + self.collective("reduce_scatter", total)
        return time

    def collective(self, op: str, nbytes: float) -> float:
        """An all-gather or reduce-scatter of `nbytes` in all over the dp x tp GPUs: as NCCL was measured on
        the GPU (sim.cost_models.collectives), else from the link (each GPU's share crossing it)."""
        gpus = self.tp * self.dp
        measured = self.collectives.time(op, nbytes, gpus) if self.collectives is not None else None
        return measured if measured is not None else self.hardware.gather_time(nbytes / gpus, gpus)

    def all_reduce(self, tokens: int) -> float:
        """One all-reduce of the hidden states of `tokens` tokens across the ranks (0 on one GPU): measured
        where the kernel source has it, else priced from the hardware's link."""
        if self.tp == 1:
            return 0.0
        nbytes = tokens * self.shape.hidden * self.shape.dtype_bytes
        measured = self.timer.all_reduce_time(nbytes, self.tp)
        return measured if measured is not None else self.hardware.all_reduce_time(nbytes, self.tp)

    def _attention(self, batch: StepBatch) -> float:
        main, rest = attention_shapes(batch)
        t = self.timer
        time = t.attention(main)
        if main.n_decode and batch.decode_context_max > batch.decode_context_min:
            alpha = t.skew_alpha(main, batch.decode_context_min, batch.decode_context_max)
            if alpha:
                wide = AttentionShape(main.prefill_chunk, main.kv_prefill, main.n_decode, batch.decode_context_max)
                time += alpha * max(t.attention(wide) - time, 0.0)
        for shape in rest:
            time += max(t.attention(shape) - self._floor, 0.0)
        return time

    def device_time(self, batch: StepBatch) -> float:
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        if tokens == 0:
            return 0.0
        before = self.timer.outside
        fixed, inside = self._fixed(max(tokens, batch.padded_tokens), batch.num_prefill_seqs + batch.num_decode_seqs,
                                    batch.moe_tokens)
        return self._counted(fixed + self.shape.num_layers * self._attention(batch), inside, before)

    def _counted(self, time: float, inside: bool, outside_before: int) -> float:
        """`time`, with the step counted, and counted as outside the measured grid when its fixed kernels
        were (`inside` False) or its attention was (the timer's count moved since `outside_before`)."""
        self.num_steps += 1
        if not inside or self.timer.outside != outside_before:
            self.steps_outside += 1
        return time

    def host_time(self, num_seqs: int) -> float:
        """The host's seconds around a step of `num_seqs` sequences."""
        return self.hardware.step_overhead + self.hardware.seq_overhead * num_seqs

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        """The kernels' sum on the device; the host's time around them only where a synchronous engine
        waits for it (async scheduling hides it behind the next step)."""
        device = self.device_time(batch)
        return StepTiming(device, 0.0 if self.async_scheduling else self.host_time(batch.num_seqs))

    def breakdown(self, batch: StepBatch) -> dict[str, float]:
        """Seconds per kernel kind for one step (all layers), for reports and tests."""
        tokens, seqs = max(batch.num_tokens, batch.padded_tokens), batch.num_seqs
        t, shape = self.timer, self.shape
        out = {op: shape.num_layers * calls * t.dense(op, tokens) for op, calls in self._attention_ops}
        out.update({op: self._dense_layers * calls * t.dense(op, tokens) for op, calls in MLP_OPS})
        out.update({op: t.dense(op, tokens) for op in STEP_OPS})
        if shape.is_moe:
            out["moe"] = shape.num_moe_layers * self.moe_layer(batch.moe_tokens or tokens)
        out["attention"] = shape.num_layers * self._attention(batch)
        out.update({op: t.per_sequence(op, seqs) for op in SEQUENCE_OPS})
        out["all_reduce"] = (2 * shape.num_layers + 1) * self.all_reduce(tokens)
        out["logits_gather"] = self.hardware.gather_time(seqs * self.rank.vocab * shape.dtype_bytes, self.tp)
        out["host"] = 0.0 if self.async_scheduling else self.host_time(seqs)
        return out

    def num_gpu_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int:
        """KV blocks (null block included) each rank's memory holds after its weight shard, one full step's
        activations and the runtime's reserve; every rank holds its heads' share of every block."""
        return kv_blocks(self.rank, self.hardware, block_size, gpu_memory_utilization, max_num_batched_tokens,
                         kv_cache_memory)

    def range_warning(self) -> str | None:
        if not self.steps_outside:
            return None
        return (f"{self.steps_outside} of {self.num_steps} steps fell outside the profiled grid of "
                f"{self.timer.source} (more tokens, sequences or context than it measured); their kernel times are "
                "extrapolated")

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, model=self.shape.name, hardware=self.hardware.name,
                             notes=tuple(self.timer.caveats()), meta={
            "name": self.name, "source": self.timer.source, "kernels": self.timer.describe(),
            "model": self.shape.describe(), "hardware": self.hardware.to_dict(), "tensor_parallel_size": self.tp,
            "data_parallel_size": self.dp, "enable_expert_parallel": self.expert_parallel,
            "collectives": self.collectives.source if self.collectives is not None else "the hardware's link model",
            "routing": self.routing.name if self.shape.is_moe else None, "async_scheduling": self.async_scheduling})


RUNTIME_RESERVE_BYTES = 512 << 20


def kv_blocks(rank: ModelShape, hardware: Hardware, block_size: int, gpu_memory_utilization: float = 0.9,
              max_num_batched_tokens: int = 8192, kv_cache_memory: int | None = None) -> int:
    """KV blocks one rank's memory share holds after its weights (a 1/tp shard), the activations of one
    full step, and the CUDA runtime's own reserve."""
    if kv_cache_memory is not None:
        available = float(kv_cache_memory)
    else:
        if hardware.memory_bytes is None:
            raise ValueError(f"hardware {hardware.name} has no memory size: pass --num-gpu-blocks-override")
        width = max(rank.intermediate, rank.top_k * rank.moe_intermediate) if rank.is_moe else rank.intermediate
        activations = max_num_batched_tokens * (4 * rank.hidden + 2 * width) * rank.dtype_bytes
        available = (hardware.memory_bytes * gpu_memory_utilization - rank.weight_bytes - activations
                     - RUNTIME_RESERVE_BYTES)
    blocks = int(available // (block_size * rank.kv_bytes_per_token))
    if blocks < 2:
        raise ValueError(f"model {rank.name} ({rank.weight_bytes / 1e9:.1f} GB of {rank.dtype} weights per GPU) "
                         f"leaves no room for a KV cache on {hardware.name} at gpu_memory_utilization "
                         f"{gpu_memory_utilization}")
    return blocks
