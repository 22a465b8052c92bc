"""Batched token sampling with vLLM v1's semantics: greedy rows, temperature, top-k, top-p, min-p,
per-request seeded generators and top-k logprobs of the raw logits, all as whole-batch tensor ops."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from engine.core.sampling_params import SamplingParams

_GREEDY_EPS = 1e-5  # a temperature below this means argmax, as in vLLM


@dataclass(slots=True)
class SamplingMetadata:
    temperature: torch.Tensor | None  # float32 [N]; None when all greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None  # [N] or None when no request uses it (1.0 = off)
    top_k: torch.Tensor | None  # int [N] or None (0 or vocab = off)
    min_p: torch.Tensor | None  # [N] or None (0 = off)
    generators: dict[int, torch.Generator]  # row index -> per-request generator (seeded requests only)
    max_num_logprobs: int | None  # None: no logprobs


@dataclass(slots=True)
class LogprobsTensors:
    logprob_token_ids: torch.Tensor  # int64 [N, 1+k]: sampled token then top-k ids
    logprobs: torch.Tensor  # float32 [N, 1+k]
    selected_token_ranks: torch.Tensor  # int64 [N]: 1-based rank of the sampled token under the raw logits


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int64 [N]
    logprobs_tensors: LogprobsTensors | None  # None when no row asked for logprobs


def build_sampling_metadata(params_list: Sequence[SamplingParams], generators: dict[int, torch.Generator],
                            device: torch.device | str) -> SamplingMetadata:
    """Pack per-request SamplingParams into batch tensors, leaving out unused knobs."""
    temps = [float(p.temperature) for p in params_list]
    greedy = [t < _GREEDY_EPS for t in temps]
    top_p = [float(p.top_p) for p in params_list]
    top_k = [max(int(p.top_k), 0) for p in params_list]  # -1 and 0 both mean off
    min_p = [float(p.min_p) for p in params_list]
    num_logprobs = [p.logprobs for p in params_list if p.logprobs is not None]

    def tensor(xs: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(xs, dtype=dtype, device=device)

    return SamplingMetadata(
        temperature=None if all(greedy) else tensor(temps, torch.float32),
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=tensor(top_p, torch.float32) if any(p < 1.0 for p in top_p) else None,
        top_k=tensor(top_k, torch.int64) if any(k > 0 for k in top_k) else None,
        min_p=tensor(min_p, torch.float32) if any(m > 0.0 for m in min_p) else None,
        generators=generators,
        max_num_logprobs=max(num_logprobs) if num_logprobs else None,
    )


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask to -inf all but the top-k tokens, then all but the smallest set whose mass reaches p.

    One descending sort serves both; top-k keeps every token tied with the k-th value.
    """
    if k is None and p is None:
        return logits
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    if k is not None:
        k = torch.where((k <= 0) | (k > vocab), vocab, k).long()
        kth = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        drop = (mass_before >= p.unsqueeze(-1)) & (p < 1.0).unsqueeze(-1)
        drop[:, 0] = False  # the best token always survives
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's."""
    probs = logits.softmax(dim=-1)
    threshold = min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Exponential race: argmax(p / E) with E ~ Exp(1) draws token i with probability p_i.

    Seeded rows take their noise from their own generator, so their tokens do not depend on the batch.
    """
    noise = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        noise.exponential_()
    for row, gen in generators.items():
        noise[row].exponential_(generator=gen)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # an exact 0 would make 0/0 = nan win argmax
    return probs.div(noise).argmax(dim=-1)


def compute_logprobs(raw_logprobs: torch.Tensor, sampled: torch.Tensor, num: int) -> LogprobsTensors:
    """Logprobs of the sampled token followed by the top-`num` tokens, and the sampled token's rank."""
    sampled = sampled.unsqueeze(-1)
    sampled_lp = raw_logprobs.gather(-1, sampled)
    ranks = (raw_logprobs >= sampled_lp).sum(dim=-1)
    top_lp, top_ids = raw_logprobs.topk(min(num, raw_logprobs.shape[-1]), dim=-1)
    ids = torch.cat([sampled, top_ids], dim=-1)
    return LogprobsTensors(ids, torch.cat([sampled_lp, top_lp], dim=-1), ranks)


class Sampler(nn.Module):
    """Logits [N, V] -> one token per row; logprobs come from the raw logits, before any processing."""

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        num_logprobs = meta.max_num_logprobs
        if num_logprobs is None:
            return SamplerOutput(self.sample(logits, meta), None)
        raw_logprobs = logits.log_softmax(dim=-1)
        sampled = self.sample(logits, meta)
        return SamplerOutput(sampled, compute_logprobs(raw_logprobs, sampled, num_logprobs))

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        temp = meta.temperature
        if meta.all_greedy or temp is None:  # temperature is None exactly when every row is greedy
            return logits.argmax(dim=-1)
        greedy = None if meta.all_random else logits.argmax(dim=-1)
        logits = logits / torch.where(temp < _GREEDY_EPS, 1.0, temp).unsqueeze(-1)
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        if meta.min_p is not None:
            logits = apply_min_p(logits, meta.min_p)
        sampled = random_sample(logits.softmax(dim=-1), meta.generators)
        return sampled if greedy is None else torch.where(temp < _GREEDY_EPS, greedy, sampled)
