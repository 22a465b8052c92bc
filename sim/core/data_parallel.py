"""One engine served with data parallelism (`--data-parallel-size N`): N ranks, each an engine core with
its own scheduler and KV cache (a `Replica`'s parts), behind one front end that assigns every request to
a rank, stepping in lockstep.

Lockstep: the sparse layers of a mixture of experts are shared by every rank (their collectives need
each one), so a step of the group ends when its slowest rank's ends, and while any rank has requests a
rank with none runs a dummy batch of one token through the model (vLLM's `execute_dummy_batch`). Each
rank's kernels run on its own tokens padded to the group's largest count (vLLM pads across data-parallel
ranks unless --enforce-eager), its MoE blocks on every rank's tokens.

Assignment follows vLLM 0.32's front end, `DPLBAsyncMPClient.get_core_engine_for_request` in
vllm/v1/engine/core_client.py: the rank with the lowest score max(in flight from this client, waiting +
running), plus 6 x waiting x max(0, KV usage - 0.5) where it has a queue, scanning from a start index that
advances by one each request so ties rotate; the chosen rank's waiting count goes up by one until the
coordinator's next snapshot of waiting, running and KV usage, which it publishes every 100 ms.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from engine.core.request import Request
from sim.core.replica import Loop, Replica, Wait
from sim.core.sources import SimRequest
from sim.cost_models.base import StepTiming
from sim.cost_models.batch import StepBatch, batch_from_output

# How often vLLM's DP coordinator publishes each engine's waiting, running and KV usage (its
# `stats_update_interval_ms` default, vllm/v1/engine/coordinator.py).
SNAPSHOT_INTERVAL_S = 0.1
# One token, as `execute_dummy_batch` runs (vllm/v1/worker/gpu_worker.py: uniform_decode_query_len).
DUMMY_BATCH = StepBatch(0, 1, 0, 1, 1, 0.0, [], 1, 1)


@dataclass(slots=True)
class RankLoad:
    """What the front end knows of one rank: the coordinator's last snapshot, bumped locally."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0  # this client's requests assigned to the rank and not yet finished


class DPLoadBalancer:
    """vLLM 0.32's data-parallel request assignment (see the module docstring)."""

    def __init__(self, num_ranks: int) -> None:
        self.loads = [RankLoad() for _ in range(num_ranks)]
        self.start = 0
        self.last_snapshot = -SNAPSHOT_INTERVAL_S

    def snapshot(self, now: float, ranks: Sequence[Replica]) -> None:
        """The coordinator's published counts, at most every SNAPSHOT_INTERVAL_S."""
        if now - self.last_snapshot < SNAPSHOT_INTERVAL_S:
            return
        self.last_snapshot = now
        for load, rank in zip(self.loads, ranks):
            s = rank.scheduler
            load.waiting, load.running, load.kv_usage = len(s.waiting), len(s.running), rank.kv_usage

    def assign(self) -> int:
        best, best_score = 0, float("inf")
        n = len(self.loads)
        for i in range(n):
            idx = (self.start + i) % n
            load = self.loads[idx]
            score = float(max(load.in_flight, load.waiting + load.running))
            if load.waiting:
                score += load.waiting * 6.0 * max(0.0, load.kv_usage - 0.5)
            if score < best_score:
                best, best_score = idx, score
        self.loads[best].waiting += 1
        self.loads[best].in_flight += 1
        self.start = (self.start + 1) % n
        return best

    def finished(self, rank: int) -> None:
        self.loads[rank].in_flight -= 1


class DataParallelEngine:
    """N data-parallel ranks as one engine of the cluster: the router sends it requests, it assigns them
    to ranks and steps the ranks together. Ranks are `Replica`s whose parts (scheduler, step cycle,
    runner, recorder) it drives; their own step policy never runs."""

    def __init__(self, index: int, cluster: Loop, ranks: list[Replica], pad_across_ranks: bool = True) -> None:
        self.index = index
        self.cluster = cluster
        self.ranks = ranks
        self.pad_across_ranks = pad_across_ranks
        self.balancer = DPLoadBalancer(len(ranks))
        self.owner: dict[str, int] = {}
        self.now = 0.0
        self.inbox: list[tuple[Request, SimRequest]] = []
        self.stepping = False
        self.idle = False
        self.policy: Generator[Wait, float, None] = self.steps()

    # ---- what the cluster and a router read ----
    @property
    def num_outstanding(self) -> int:
        return len(self.inbox) + sum(r.num_outstanding for r in self.ranks)

    @property
    def kv_usage(self) -> float:
        return sum(r.kv_usage for r in self.ranks) / len(self.ranks)

    def cached_prefix_blocks(self, block_hashes: Sequence[bytes]) -> int:
        return max(r.cached_prefix_blocks(block_hashes) for r in self.ranks)

    def rewind(self, t: float) -> None:
        """Data-parallel ranks take no decode runs: nothing to take back."""

    def release(self) -> None:
        self.policy.close()
        for r in self.ranks:
            r.release()

    # ---- requests in, steps out ----
    def _take_inbox(self) -> None:
        """Each arrival assigned to a rank as the front end assigns it, at its arrival."""
        inbox, self.inbox = self.inbox, []
        for req, sim_req in inbox:
            self.now = max(self.now, sim_req.add_time)
            self.balancer.snapshot(self.now, self.ranks)
            rank = self.balancer.assign()
            r = self.ranks[rank]
            r.now = self.now
            r.add(req, sim_req)
            if req.is_finished():  # rejected on add
                self.balancer.finished(rank)
            else:
                self.owner[req.request_id] = rank

    def _launch(self, step: int) -> tuple[float, bool]:
        """Schedule and launch one step on every rank (an idle one's empty schedule stands for its dummy
        batch) and price them together: the group's step lasts its slowest rank's."""
        batches = []
        for r in self.ranks:
            r.now = self.now
            entry = r.cycle.begin()
            batch = batch_from_output(entry.so)
            batches.append((entry, batch if batch.num_tokens else DUMMY_BATCH))
            if r.headroom is not None:
                r.headroom.scheduled(entry.so, r.scheduler.requests, len(r.scheduler.running))
        largest = max(b.num_tokens for _, b in batches)
        pad = largest if self.pad_across_ranks else 0
        group = len(batches) * largest if self.pad_across_ranks else sum(b.num_tokens for _, b in batches)
        cost_model = self.cluster.cost_model
        timings = [cost_model.step_time(StepBatch(
            b.num_prefill_tokens, b.num_decode_tokens, b.num_prefill_seqs, b.num_decode_seqs, b.context_tokens,
            b.prefill_attention, b.prefill_chunks, b.decode_context_min, b.decode_context_max, moe_tokens=group,
            padded_tokens=pad), step) for _, b in batches]
        longest = max(t.total for t in timings)
        for (entry, _), t in zip(batches, timings):  # each rank's device waits for the slowest
            entry.cost = StepTiming(longest - t.host - t.gap, t.host, t.gap)
        return longest, any(entry.so.total_num_scheduled_tokens for entry, _ in batches)

    def finish_step(self) -> None:
        """The group's step ends on every rank at once."""
        self.stepping = False
        for i, r in enumerate(self.ranks):
            r.now = self.now
            r.finish_step()
            last = r.last
            if last is not None:
                for out in last[1].outputs:
                    if out.finish_reason is not None and self.owner.pop(out.request_id, None) is not None:
                        self.balancer.finished(i)

    def _has_work(self) -> bool:
        return any(r.cycle.has_work() for r in self.ranks)

    def steps(self) -> Generator[Wait, float, None]:
        """The ranks' engine-core loops run together: while any rank has work every rank launches a step
        (vLLM's batch queue of the cycles' depth: 2 is async scheduling), and each step's outputs apply
        at the group's step end; with no work anywhere the group waits for a request."""
        cluster, ranks = self.cluster, self.ranks
        ends: deque[float] = deque()
        device_free = 0.0
        launched = 0
        while True:
            if self.now > cluster.now:
                yield self.now
            self._take_inbox()
            if self._has_work():
                length, scheduled = self._launch(launched)
                device_free = (device_free if device_free > self.now else self.now) + length
                launched += 1
                ends.append(device_free)
                lead = ranks[0].cycle  # every rank launches every step: their queues are alike
                if len(lead.in_flight) < lead.batch_queue_size and (scheduled or self._has_work()):
                    continue
            elif not ranks[0].cycle.in_flight:
                self.now = max(self.now, (yield from self._next_request()))
                continue
            end = ends.popleft()
            if end > self.now:
                self.now = end
            self.stepping = True
            yield self.now
            if self._has_work() and all(r.last is not None and r.cycle.did_nothing(*r.last) for r in ranks):
                # Nothing ran anywhere and nothing can until a request arrives: wait for one.
                self.now = max(self.now, (yield from self._next_request()))

    def _next_request(self) -> Generator[Wait, float, float]:
        if self.inbox:
            return self.inbox[0][1].add_time
        self.idle = True
        return (yield None)
