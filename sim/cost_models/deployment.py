"""How a model is laid out and stored on its GPUs, as vLLM's flags say it: tensor, data and expert
parallelism, the KV cache's dtype and weight quantization, and (for a mixture of experts) the routing
model the MoE blocks are priced under. One record that every cost model is built from."""
from __future__ import annotations

from dataclasses import dataclass

from sim.cost_models.model_shape import KV_CACHE_DTYPES, QUANTIZATIONS, ModelShape, rank_shape, with_dtypes
from sim.cost_models.routing import RoutingModel, routing_model


@dataclass(frozen=True, slots=True)
class Deployment:
    """vLLM's --tensor-parallel-size, --data-parallel-size, --enable-expert-parallel, --kv-cache-dtype and
    --quantization; `routing` is `balanced` or `zipf:EXPONENT`. GPUs: data parallel x tensor parallel."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    routing: str = "balanced"

    def __post_init__(self) -> None:
        for flag, value in (("--tensor-parallel-size", self.tensor_parallel_size),
                            ("--data-parallel-size", self.data_parallel_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag}: must be an integer >= 1, got {value!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                             f"{self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"--quantization: must be fp8 or none, got {self.quantization!r}")
        routing_model(self.routing)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def routing_model(self) -> RoutingModel:
        return routing_model(self.routing)

    def shape(self, shape: ModelShape) -> ModelShape:
        """The model stored as deployed (fp8 KV cache, fp8 weights)."""
        return with_dtypes(shape, self.kv_cache_dtype, self.quantization)

    def rank(self, shape: ModelShape) -> ModelShape:
        """One GPU's shard of the deployed model."""
        return rank_shape(self.shape(shape), self.tensor_parallel_size, self.data_parallel_size,
                          self.enable_expert_parallel)
