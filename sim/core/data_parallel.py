"""One engine served with data parallelism (`--data-parallel-size N`): N ranks, each an engine core with
its own scheduler and KV cache (a `Replica`'s parts), behind one front end that assigns every request to
a rank, stepping in lockstep.

Lockstep: the sparse layers of a mixture of experts are shared by every rank (their collectives need
each one), so a step of the group ends when its slowest rank's ends, and while any rank has requests a
rank with none runs a dummy batch of one token through the model (vLLM's `execute_dummy_batch`). The
ranks learn that every one is idle only every 32 steps (vLLM's finish-sync all-reduce,
`_has_global_unfinished_reqs` in vllm/v1/engine/core.py): until then a "wave" goes on in dummy batches. The MoE
blocks run every rank's tokens (vLLM's default all-gather / reduce-scatter dispatch). Where the step runs
as a CUDA graph on every rank (no --enforce-eager, and the largest rank's tokens within the capture sizes,
min(2 x max_num_seqs, 512)), each rank is padded to the largest rank's token count
(vllm/v1/worker/dp_utils.py, coordinate_batch_across_dp; vllm/config/vllm.py for the capture sizes).

Assignment follows the front end's `DPLBAsyncMPClient.get_core_engine_for_request`
(vllm/v1/engine/core_client.py), as the run's vLLM version had it. In 0.19: the rank with the lowest
4 x waiting + running, ties to the lowest rank. In 0.32: the lowest max(in flight from this client,
waiting + running), plus 6 x waiting x max(0, KV usage - 0.5) where it has a queue, scanning from a start
that advances by one each request so ties rotate. Both bump the chosen rank's waiting count until the
coordinator's next snapshot of waiting, running (and KV usage), which it publishes every 100 ms while they
change (vllm/v1/engine/coordinator.py). Versions between are taken to have 0.19's rule, before 0.32 after.
"""
from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace

from engine.core.request import Request
from sim.core.replica import EngineLoop, Loop, Replica, Wait
from sim.core.sources import SimRequest
from sim.cost_models.base import StepTiming
from sim.cost_models.batch import StepBatch, batch_from_output

# How often vLLM's DP coordinator publishes each engine's waiting, running and KV usage (its
# `stats_update_interval_ms` default, vllm/v1/engine/coordinator.py).
SNAPSHOT_INTERVAL_S = 0.1
# Group steps between the ranks' checks that every one is idle (vllm/v1/engine/core.py).
FINISH_SYNC_STEPS = 32
# One token, as `execute_dummy_batch` runs (vllm/v1/worker/gpu_worker.py: uniform_decode_query_len).
DUMMY_BATCH = StepBatch(0, 1, 0, 1, 1, 0.0, [], 1, 1)


@dataclass(slots=True)
class RankLoad:
    """What the front end knows of one rank: the coordinator's last snapshot, bumped locally."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0  # this client's requests assigned to the rank and not yet finished


# The first vLLM version whose front end scores ranks by in-flight requests and KV pressure.
IN_FLIGHT_RULE_SINCE = (0, 32)


class DPLoadBalancer:
    """vLLM's data-parallel request assignment, as `vllm_version` had it (see the module docstring)."""

    def __init__(self, num_ranks: int, vllm_version: str | None = None) -> None:
        self.loads = [RankLoad() for _ in range(num_ranks)]
        self.start = 0
        self.last_snapshot = -SNAPSHOT_INTERVAL_S
        self.in_flight_rule = vllm_version is None or _minor(vllm_version) >= IN_FLIGHT_RULE_SINCE

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
            if self.in_flight_rule:
                score = float(max(load.in_flight, load.waiting + load.running))
                if load.waiting:
                    score += load.waiting * 6.0 * max(0.0, load.kv_usage - 0.5)
            else:
                score = 4.0 * load.waiting + load.running
            if score < best_score:
                best, best_score = idx, score
        self.loads[best].waiting += 1
        self.loads[best].in_flight += 1
        if self.in_flight_rule:
            self.start = (self.start + 1) % n
        return best

    def finished(self, rank: int) -> None:
        self.loads[rank].in_flight -= 1


class DataParallelEngine(EngineLoop):
    """N data-parallel ranks as one engine of the cluster: the router sends it requests, it assigns them
    to ranks and steps the ranks together, through the engine loop every replica runs (EngineLoop).
    Ranks are `Replica`s whose parts (scheduler, step cycle, runner, recorder) it drives; their own loop
    never runs. Recorded step starts, external finishes, decode runs and a calibrated intake are one
    engine core's: a data-parallel engine has none."""

    def __init__(self, index: int, cluster: Loop, ranks: list[Replica], graph_tokens: int = 0,
                 vllm_version: str | None = None) -> None:
        """`graph_tokens`: the largest step that runs as a CUDA graph, and so is padded across ranks (0:
        eager, never padded); `vllm_version`: whose load-balancing rule assigns requests (None: 0.32's)."""
        self.index = index
        self.cluster = cluster
        self.ranks = ranks
        self.graph_tokens = graph_tokens
        self.balancer = DPLoadBalancer(len(ranks), vllm_version)
        self.owner: dict[str, int] = {}
        self.wave_steps = 0  # group steps since the ranks last found every one idle
        self.now = 0.0
        self.inbox: list[tuple[Request, SimRequest]] = []
        self.external: dict[int, list[tuple[str, str]]] = {}
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

    # ---- requests in ----
    def add(self, req: Request, sim_req: SimRequest) -> None:
        """Assign the request to a rank as the front end does, and add it there now."""
        self.balancer.snapshot(self.now, self.ranks)
        rank = self.balancer.assign()
        r = self.ranks[rank]
        r.now = self.now
        r.add(req, sim_req)
        if req.is_finished():  # rejected on add
            self.balancer.finished(rank)
        else:
            self.owner[req.request_id] = rank

    def _take_inbox(self) -> None:
        for req, sim_req in self._drain():
            self.now = max(self.now, sim_req.add_time)
            self.add(req, sim_req)

    def _drain(self) -> list[tuple[Request, SimRequest]]:
        inbox, self.inbox = self.inbox, []
        return inbox

    def finish_external(self, items: list[tuple[str, str]]) -> None:
        raise ValueError("external finishes are one engine core's: a data-parallel engine has none")

    # ---- steps ----
    def _work(self) -> bool:
        return any(r.scheduler.running or r.cycle.has_work() for r in self.ranks)

    def _busy(self) -> bool:
        """Work on some rank, or a wave that has not yet reached its check that every rank is idle."""
        if self._work():
            return True
        if self.wave_steps % FINISH_SYNC_STEPS:
            return True
        self.wave_steps = 0
        return False

    def _in_flight(self) -> bool:
        return bool(self.ranks[0].cycle.in_flight)  # every rank launches every step: their queues are alike

    def _decode_run(self, step: int) -> tuple[int, float]:
        return 0, self.now

    def _steps_finished(self) -> int:
        return self.ranks[0].cycle.num_steps

    def _launch(self, step: int) -> tuple[float, bool]:
        """Schedule and launch one step on every rank (an idle one's empty schedule stands for its dummy
        batch) and price them together: (the group's step, which lasts its slowest rank's; whether the
        batch queue takes another step first)."""
        self.wave_steps += 1
        batches = []
        for r in self.ranks:
            r.now = self.now
            entry = r.cycle.begin()
            batch = batch_from_output(entry.so)
            batches.append((entry, batch if batch.num_tokens else DUMMY_BATCH))
            if r.headroom is not None:
                r.headroom.scheduled(entry.so, r.scheduler.requests, len(r.scheduler.running))
        largest = max(b.num_tokens for _, b in batches)
        pad = largest if largest <= self.graph_tokens else 0
        group = len(batches) * largest if pad else sum(b.num_tokens for _, b in batches)
        cost_model = self.cluster.cost_model
        timings = [cost_model.step_time(replace(b, moe_tokens=group, padded_tokens=pad), step) for _, b in batches]
        longest = max(t.total for t in timings)
        for (entry, _), t in zip(batches, timings):  # each rank's device waits for the slowest
            entry.cost = StepTiming(longest - t.host - t.gap, t.host, t.gap)
        ahead = any(r.cycle.may_schedule_ahead(entry.so) for r, (entry, _) in zip(self.ranks, batches))
        return longest, ahead

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

    def _stalled(self) -> bool:
        return self._work() and all(r.last is not None and r.cycle.did_nothing(*r.last) for r in self.ranks)


def _minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as 0.19.0 or 0.11.2rc1; (0, 0) where it names none."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0) if len(parts) > 1 else 0
    except ValueError:
        return 0, 0


def cuda_graph_tokens(max_num_seqs: int, enforce_eager: bool) -> int:
    """vLLM's largest CUDA-graph capture size, min(2 x max_num_seqs, 512) (vllm/config/vllm.py); 0 eager."""
    return 0 if enforce_eager else min(2 * max_num_seqs, 512)
