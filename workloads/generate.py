"""Request streams: arrival processes, length distributions, prefix groups and deterministic token ids.

Everything is drawn in fixed-size chunks from numpy PCG64 streams keyed by (seed, purpose[, chunk]), so a
stream is reproducible on any machine, memory stays bounded, and capping the count never changes the
requests that remain.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count, islice
from pathlib import Path

import numpy as np

from workloads.importers import MOONCAKE_BLOCK_TOKENS, read_trace
from workloads.spec import (MAX_LENGTH, EmpiricalLength, FixedLength, GammaArrival, LengthDist, LognormalLength,
                            NormalLength, OnOffArrival, TraceArrival, UniformLength, WorkloadSpec, ZipfLength)

CHUNK = 1024
FIRST_TOKEN_ID = 3  # ids below this are left alone: tokenizers put BOS/EOS/PAD there
TOKEN_RUN = 1 << 18  # ids drawn per numpy call: amortises the call, bounds memory
# One independent random stream per purpose: editing one part of a workload leaves the other draws alone.
_ARRIVAL, _PROMPT, _OUTPUT, _PREFIX, _TOKENS, _GROUP, _BLOCK = range(1, 8)

Sampler = Callable[[np.random.Generator, int], np.ndarray]
# arrivals, prompt/output lengths, hash ids, the trace's own prompt token ids
Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, list[list[int]] | None, list[list[int]] | None]


@dataclass(slots=True)
class WorkloadRequest:
    """One request as both `engine run` and `sim replay` submit it. `prompt_token_ids` is None for a
    prompt longer than the `max_prompt_tokens` its stream was asked for: such a request can only be
    refused, and its ids are never made."""

    request_id: str
    arrival: float
    prompt_token_ids: list[int] | None
    max_tokens: int
    num_prompt_tokens: int


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, *key]))


def _raw_draw(dist: LengthDist) -> Sampler:
    """Unrounded, unclipped draws of one distribution."""
    match dist:
        case FixedLength():
            return lambda rng, n: np.full(n, float(dist.value))
        case UniformLength():
            return lambda rng, n: rng.integers(dist.min, dist.max + 1, n).astype(np.float64)
        case NormalLength():
            return lambda rng, n: rng.normal(dist.mean, dist.std, n)
        case LognormalLength():
            return lambda rng, n: dist.median * np.exp(dist.sigma * rng.standard_normal(n))
        case ZipfLength():
            support = np.arange(dist.min, dist.max + 1, dtype=np.float64)
            cdf = np.cumsum((support / dist.min) ** -dist.a)  # relative to min: the first weight is 1, never 0
            cdf /= cdf[-1]
            last = len(support) - 1
            return lambda rng, n: support[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), last)]
        case EmpiricalLength():
            values = np.asarray(dist.values, dtype=np.float64)
            p = None if dist.weights is None else np.asarray(dist.weights) / sum(dist.weights)
            return lambda rng, n: rng.choice(values, n, p=p)
    raise TypeError(f"unknown length distribution {dist!r}")


def length_sampler(dist: LengthDist) -> Sampler:
    """A function (rng, n) -> n integer lengths, clipped to [min, max] and never below 1."""
    draw, lo, hi = _raw_draw(dist), dist.min or 1, dist.max or MAX_LENGTH
    return lambda rng, n: np.clip(np.rint(draw(rng, n)), lo, hi).astype(np.int64)


def gap_sampler(arrival) -> Sampler:
    """Inter-arrival gaps with mean 1/rate (for onoff: on the clock that only runs while on)."""
    if isinstance(arrival, GammaArrival):
        shape = 1.0 / arrival.cv ** 2
        return lambda rng, n: rng.gamma(shape, 1.0 / (arrival.rate * shape), n)
    if arrival.process == "constant":
        return lambda rng, n: np.full(n, 1.0 / arrival.rate)
    return lambda rng, n: rng.exponential(1.0 / arrival.rate, n)


def _scaled(lengths: np.ndarray, factor: float) -> np.ndarray:
    return lengths if factor == 1.0 else np.clip(np.rint(lengths * factor), 1, MAX_LENGTH).astype(np.int64)


def _synthetic_chunks(spec: WorkloadSpec) -> Iterator[Chunk]:
    """Endless chunks of (arrivals, prompt lengths, output lengths); the first request arrives at 0."""
    arrival = spec.arrival
    assert spec.prompt_tokens is not None and spec.output_tokens is not None  # checked when the file was read
    gaps, prompt, output = gap_sampler(arrival), length_sampler(spec.prompt_tokens), length_sampler(spec.output_tokens)
    rng_a, rng_p, rng_o = _rng(spec.seed, _ARRIVAL), _rng(spec.seed, _PROMPT), _rng(spec.seed, _OUTPUT)
    clock = 0.0
    for chunk_no in count():
        g = gaps(rng_a, CHUNK)
        if chunk_no == 0:
            g[0] = 0.0
        t = clock + np.cumsum(g)
        clock = float(t[-1])
        if isinstance(arrival, OnOffArrival):
            cycles = np.floor(t / arrival.on)
            t = cycles * (arrival.on + arrival.off) + (t - cycles * arrival.on)
        yield t, prompt(rng_p, CHUNK), output(rng_o, CHUNK), None, None


def _trace_chunks(arrival: TraceArrival, path: Path) -> Iterator[Chunk]:
    rows = read_trace(path, arrival.format)
    while batch := list(islice(rows, CHUNK)):
        t = np.array([r.arrival for r in batch]) * arrival.time_scale
        prompt = np.array([r.prompt_tokens for r in batch], dtype=np.int64)
        output = np.array([r.output_tokens for r in batch], dtype=np.int64)
        hashes = [r.hash_ids or [] for r in batch] if arrival.format == "mooncake" else None
        ids = [r.prompt_token_ids or [] for r in batch] if batch[0].prompt_token_ids is not None else None
        yield t, prompt, output, hashes, ids


class BlockTable:
    """Token ids of Mooncake hash blocks, a pure function of (seed, hash id): equal ids, equal content."""

    PER_DRAW, CACHED_DRAWS = 256, 32

    def __init__(self, seed: int, block_tokens: int, vocab_size: int) -> None:
        self.seed, self.block_tokens, self.vocab_size = seed, block_tokens, vocab_size
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def block(self, hash_id: int) -> np.ndarray:
        draw, row = divmod(hash_id, self.PER_DRAW)
        table = self._cache.get(draw)
        if table is None:
            table = _rng(self.seed, _BLOCK, draw).integers(
                FIRST_TOKEN_ID, self.vocab_size, (self.PER_DRAW, self.block_tokens), dtype=np.int32)
            self._cache[draw] = table
            if len(self._cache) > self.CACHED_DRAWS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(draw)
        return table[row]

    def tokens(self, hash_ids: list[int], length: int) -> list[int]:
        """The first `length` ids of the concatenated blocks (length <= len(hash_ids) * block_tokens)."""
        blocks = [self.block(h) for h in hash_ids[:math.ceil(length / self.block_tokens)]]
        return np.concatenate(blocks)[:length].tolist() if blocks else []


def _token_lists(seed: int, chunk_no: int, lengths: list[int], vocab_size: int,
                 refused: list[bool]) -> Iterator[list[int] | None]:
    """Each request's own token ids, drawn in bulk runs of about TOKEN_RUN ids (one numpy call per run).
    A request longer than TOKEN_RUN draws from a stream of its own, so a `refused` one (None) costs
    nothing, and the others' ids do not depend on which are refused."""
    rng = _rng(seed, _TOKENS, chunk_no)
    bulk = [n if n <= TOKEN_RUN else 0 for n in lengths]
    ends = np.cumsum(bulk)
    start = 0
    while start < len(lengths):
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + TOKEN_RUN, side="right")))
        ids = rng.integers(FIRST_TOKEN_ID, vocab_size, int(ends[stop - 1]) - base, dtype=np.int64).tolist()
        offset = 0
        for j in range(start, stop):
            n = lengths[j]
            if refused[j]:
                yield None
            elif n > TOKEN_RUN:
                yield _rng(seed, _TOKENS, chunk_no, j).integers(FIRST_TOKEN_ID, vocab_size, n, dtype=np.int64).tolist()
            else:
                yield ids[offset:offset + n]
            offset += bulk[j]
        start = stop


def stream_requests(spec: WorkloadSpec, trace_path: Path | None, vocab_size: int, limit: int | None,
                    time_scale: float, max_prompt_tokens: int | None = None) -> Iterator[WorkloadRequest]:
    """The workload's requests in arrival order, built one chunk at a time; a prompt longer than
    `max_prompt_tokens` comes without its ids (see WorkloadRequest)."""
    caps = [c for c in (spec.num_requests, limit) if c is not None]
    cap = min(caps) if caps else None
    scale, seed, prefix = spec.length_scale, spec.seed, spec.prefix
    if isinstance(spec.arrival, TraceArrival):
        if trace_path is None:
            raise ValueError("a trace workload's requests need its trace file")
        chunks = _trace_chunks(spec.arrival, trace_path)
    else:
        chunks = _synthetic_chunks(spec)
    blocks = BlockTable(seed, max(1, round(MOONCAKE_BLOCK_TOKENS * scale)), vocab_size)
    prefix_len = min(max(1, round(prefix.tokens * scale)), MAX_LENGTH) if prefix else 0
    prefix_rng, prefixes = _rng(seed, _PREFIX), {}
    index = 0
    for chunk_no, (arrivals, prompt_len, output_len, hashes, given) in enumerate(chunks):
        if cap is not None and index >= cap:
            return
        n = len(arrivals)
        prompt_len, output_len = _scaled(prompt_len, scale), _scaled(output_len, scale)
        group = np.full(n, -1, dtype=np.int64)
        if prefix:
            shared = prefix_rng.random(CHUNK)[:n] < prefix.fraction
            group = np.where(shared, prefix_rng.integers(0, prefix.groups, CHUNK)[:n], -1)
            prompt_len = np.where(shared, np.maximum(prompt_len, prefix_len + 1), prompt_len)
            head = np.where(shared, prefix_len, 0)
        elif hashes is not None:
            head = np.minimum(prompt_len, [len(h) * blocks.block_tokens for h in hashes])
        else:
            head = np.zeros(n, dtype=np.int64)
        refused = (prompt_len > max_prompt_tokens if max_prompt_tokens is not None else np.zeros(n, bool)).tolist()
        if given is not None:  # the trace's real prompts, cut to a scaled length: shared prefixes stay shared
            tails = iter([None if no else p[:k] for p, k, no in zip(given, prompt_len.tolist(), refused)])
        else:
            tails = _token_lists(seed, chunk_no, (prompt_len - head).tolist(), vocab_size, refused)
        for j, (t, out, g, h, n_prompt) in enumerate(zip(arrivals.tolist(), output_len.tolist(), group.tolist(),
                                                         head.tolist(), prompt_len.tolist())):
            if (cap is not None and index >= cap) or (spec.duration is not None and t > spec.duration):
                return
            ids = next(tails)
            if ids is not None and g >= 0:
                if g not in prefixes:
                    prefixes[g] = _rng(seed, _GROUP, g).integers(FIRST_TOKEN_ID, vocab_size, prefix_len).tolist()
                ids = prefixes[g] + ids
            elif ids is not None and h and hashes is not None:
                ids = blocks.tokens(hashes[j], h) + ids
            yield WorkloadRequest(f"w{index}", t * time_scale, ids, out, n_prompt)
            index += 1
