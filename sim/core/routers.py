"""Routers: which replica of a cluster gets an arriving request.

A router sees each replica only through `ReplicaView` (outstanding requests, KV usage, the block pool's
prefix-cache map), so it decides on the state the replicas' own `engine.core` schedulers are in at the
arrival time. Every router is deterministic: ties go to the lowest replica index, and the random one
draws from its own seeded generator.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from engine.core.request import Request

ROUTERS = ("round_robin", "least_outstanding", "least_kv", "power_of_two", "prefix_affinity")


class ReplicaView(Protocol):
    """What a router may read of a replica."""

    index: int

    @property
    def num_outstanding(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    def cached_prefix_blocks(self, block_hashes: Sequence[bytes]) -> int: ...


class Router(Protocol):
    name: str
    # Whether a decision can depend on the replicas' KV blocks (their size, their count): a plan proves a
    # configuration runs as one of another block size only behind a router that never reads them.
    reads_blocks: bool

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        """Index of the replica that serves `request`."""
        ...


def _least_outstanding(replicas: Sequence[ReplicaView]) -> int:
    return min(replicas, key=lambda r: (r.num_outstanding, r.index)).index


class RoundRobin:
    name = "round_robin"
    reads_blocks = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


class LeastOutstanding:
    """Fewest requests queued, running or waiting to be added: the usual load balancer's choice."""

    name = "least_outstanding"
    reads_blocks = False

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return _least_outstanding(replicas)


class LeastKV:
    """Lowest KV cache usage (then fewest outstanding): spreads memory pressure, not request counts."""

    name = "least_kv"
    reads_blocks = True

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (r.kv_usage, r.num_outstanding, r.index)).index


class PowerOfTwo:
    """Two replicas drawn at random, the less loaded wins: near least-loaded balance without a global scan."""

    name = "power_of_two"
    reads_blocks = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        if len(replicas) == 1:
            return 0
        a, b = self._rng.sample(range(len(replicas)), 2)
        ra, rb = replicas[a], replicas[b]
        return a if (ra.num_outstanding, a) <= (rb.num_outstanding, b) else b


class PrefixAffinity:
    """Send a request where the longest prefix of its prompt is: cached in a replica's block pool, or
    sent earlier by this router (blocks not computed yet, or a request still in an inbox). Among equal
    matches, and when nothing matches, the least loaded replica wins. A replica loaded beyond `balance`
    times the lightest one (plus one) is passed over, so one hot prefix cannot take all the traffic."""

    name = "prefix_affinity"
    reads_blocks = True

    def __init__(self, balance: float = 2.0, max_probe_blocks: int = 64, memory: int = 1 << 20) -> None:
        self.balance = balance
        self.max_probe_blocks = max_probe_blocks
        self.memory = memory
        self._owner: dict[bytes, int] = {}

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        hashes = request.block_hashes[:self.max_probe_blocks]
        least = _least_outstanding(replicas)
        if not hashes:
            return least
        scores = [r.cached_prefix_blocks(hashes) for r in replicas]
        depth, owner = 0, -1
        for h in hashes:
            o = self._owner.get(h)
            if o is None:
                break
            depth, owner = depth + 1, o
        if owner >= 0 and depth > scores[owner]:
            scores[owner] = depth
        limit = self.balance * (replicas[least].num_outstanding + 1)
        top = max(scores)
        fits = [r for r in replicas if scores[r.index] == top and r.num_outstanding <= limit]
        best = min(fits, key=lambda r: (r.num_outstanding, r.index)).index if top and fits else least
        if len(self._owner) > self.memory:
            self._owner.clear()
        for h in hashes:
            self._owner[h] = best
        return best


def make_router(name: str, seed: int = 0) -> Router:
    """A router by name; ValueError lists the valid names."""
    key = name.strip().lower().replace("-", "_")
    if key == "round_robin":
        return RoundRobin()
    if key == "least_outstanding":
        return LeastOutstanding()
    if key == "least_kv":
        return LeastKV()
    if key == "power_of_two":
        return PowerOfTwo(seed)
    if key == "prefix_affinity":
        return PrefixAffinity()
    raise ValueError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")
