"""Property tests of the paged KV cache: random admission, growth, preemption and freeing must keep the
block pool's books exact, and the scheduler on a tight pool must always finish without leaking blocks."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core import KVCacheManager, Request, SamplingParams
from engine.core.block_pool import KVCacheBlock
from core_helpers import EOS, fake_output, make_scheduler

SYSTEM_PROMPT = [5, 6, 7, 8, 5, 6, 7, 8]
UNMADE_RUN = -2  # the block id of the sentinel standing for the free queue's blocks not made yet
TOKENS = st.integers(1, 2)
PICK = st.integers(0, 1_000)


def walk(start: KVCacheBlock, end: KVCacheBlock, link: str, limit: int) -> list[KVCacheBlock]:
    """Follow the free queue's links; bounded, so a corrupted (cyclic) list fails instead of hanging."""
    out, block = [], getattr(start, link)
    while block is not end:
        assert block is not None and len(out) < limit, "free queue is broken or cyclic"
        out.append(block)
        block = getattr(block, link)
    return out


def check_pool(kv: KVCacheManager) -> None:
    """Book-keeping every caller of the pool relies on, checked from the blocks themselves."""
    pool = kv.block_pool
    queue = pool.free_block_queue
    forward = walk(queue._head, queue._tail, "next_free_block", pool.num_blocks)
    backward = walk(queue._tail, queue._head, "prev_free_block", pool.num_blocks)
    assert backward[::-1] == forward, "free queue links disagree between directions"
    runs = [b for b in forward if b.block_id == UNMADE_RUN]
    assert len(runs) == bool(queue.unmade), "the unmade blocks' run is linked exactly while some are left"
    free_ids = [i for b in forward for i in (queue.unmade if b.block_id == UNMADE_RUN else [b.block_id])]
    assert queue.num_free_blocks == len(free_ids)
    assert [b.block_id for b in pool.made_blocks] == list(range(len(pool.made_blocks))), "made blocks out of id order"
    assert not queue.unmade or queue.unmade == range(len(pool.made_blocks), pool.num_blocks)
    assert len(set(free_ids)) == len(free_ids), "a block is in the free queue twice"
    assert 0 not in free_ids, "the null block is in the free queue"

    holders: dict[int, int] = {}
    for rid, blocks in kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert len(set(ids)) == len(ids), f"{rid} holds a block twice"
        assert 0 not in ids, f"{rid} holds the null block"
        for i in ids:
            holders[i] = holders.get(i, 0) + 1
    assert not set(free_ids) & set(holders), "a block is both free and held"
    assert len(free_ids) + len(holders) == pool.num_usable_blocks, "a block is neither free nor held"
    for b in pool.made_blocks[1:]:
        assert b.ref_cnt == holders.get(b.block_id, 0), f"{b} ref_cnt != number of holders"
        if b.block_id not in free_ids:
            assert b.prev_free_block is None and b.next_free_block is None, f"{b} keeps stale free links"
    assert set(kv.num_cached_block) == set(kv.req_to_blocks)

    table = pool.cached_block_hash_to_block
    for h, same in table.items():
        by_id = same if isinstance(same, dict) else {same.block_id: same}
        assert len(by_id) > isinstance(same, dict), "the cache keeps a dict of one block, or of none"
        for block_id, b in by_id.items():
            assert b.block_hash == h and b.block_id == block_id, f"cache maps a hash to {b}, which has another hash"
    for b in pool.made_blocks:
        if b.block_hash is not None:
            assert b in pool.cached_blocks(b.block_hash), f"{b} has a hash the cache does not map to it"
    cached_seen = False
    for b in forward:
        cached_seen |= b.block_hash is not None
        assert b.block_hash is not None or not cached_seen, "a blank free block sits behind a cached one"


def snapshot(kv: KVCacheManager) -> tuple:
    """Everything allocate_slots could touch, in comparable form."""
    def link(b: KVCacheBlock | None) -> int | None:
        return None if b is None else b.block_id

    pool = kv.block_pool
    blocks = [(b.ref_cnt, b.block_hash, link(b.prev_free_block), link(b.next_free_block)) for b in pool.made_blocks]
    queue = pool.free_block_queue
    free = [b.block_id for b in walk(queue._head, queue._tail, "next_free_block", pool.num_blocks)], queue.unmade
    held = {rid: [b.block_id for b in bl] for rid, bl in kv.req_to_blocks.items()}
    table = {h: [b.block_id for b in pool.cached_blocks(h)] for h in pool.cached_block_hash_to_block}
    return blocks, free, held, dict(kv.num_cached_block), table, pool.num_evictions


class KVCacheMachine(RuleBasedStateMachine):
    """Drives a KVCacheManager the way the scheduler does; every allocation is computed in the same
    rule (one step), except in `preempt_scheduled`, which frees a request before its step's KV exists
    (vLLM 0.32 keeps the hashes it published for that step; the machine tracks those blocks apart)."""

    @initialize(num_blocks=st.integers(8, 40), block_size=st.integers(2, 4))
    def setup(self, num_blocks: int, block_size: int) -> None:
        self.bs = block_size
        self.kv = KVCacheManager(num_blocks, block_size, max_model_len=num_blocks * block_size * 2)
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.next_id = 0
        # block_id -> hash of the content actually computed into it, to catch hits on unwritten KV.
        self.written: dict[int, bytes] = {}
        # block_id -> hash published for a step that never ran (its owner preempted in that step).
        self.published_unwritten: dict[int, bytes] = {}

    def _allocate(self, req: Request, n: int, num_hit: int = 0,
                  hits: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        before = snapshot(self.kv)
        new = self.kv.allocate_slots(req, n, num_hit, hits)
        if new is None:
            assert snapshot(self.kv) == before, "a failed allocate_slots changed the pool"
        else:
            for b in new:
                self.written.pop(b.block_id, None)
                self.published_unwritten.pop(b.block_id, None)
        return new

    def _commit(self, req: Request, num_computed: int, token: int) -> None:
        """The step ran: the KV of the scheduled tokens is written, and a finished prefill samples."""
        req.num_computed_tokens = num_computed
        blocks = self.kv.req_to_blocks[req.request_id]
        for i in range(num_computed // self.bs):
            self.written[blocks[i].block_id] = req.block_hashes[i]
            self.published_unwritten.pop(blocks[i].block_id, None)
        if num_computed == req.num_tokens:
            req.append_output_token_ids(token)

    def _admit(self, req: Request, chunk: int, token: int) -> bool:
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit < req.num_tokens, "a prefix hit covered the last prompt token"
        assert num_hit % self.bs == 0 and len(hits) == num_hit // self.bs
        n = 1 + chunk % (req.num_tokens - num_hit)
        if self._allocate(req, n, num_hit, hits) is None:
            return False
        self._commit(req, num_hit + n, token)
        self.running.append(req)
        return True

    @rule(shared=st.booleans(), tail=st.lists(TOKENS, min_size=1, max_size=12), chunk=PICK, token=TOKENS)
    def add_request(self, shared: bool, tail: list[int], chunk: int, token: int) -> None:
        req = Request(f"r{self.next_id}", (SYSTEM_PROMPT if shared else []) + tail, SamplingParams(),
                      block_size=self.bs)
        self.next_id += 1
        if not self._admit(req, chunk, token):
            self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(pick=PICK, chunk=PICK, token=TOKENS)
    def readmit(self, pick: int, chunk: int, token: int) -> None:
        """A waiting or preempted request starts over, reusing whatever prefix is still cached."""
        req = self.waiting[pick % len(self.waiting)]
        if self._admit(req, chunk, token):
            self.waiting.remove(req)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, chunk=PICK, token=TOKENS)
    def advance(self, pick: int, chunk: int, token: int) -> None:
        """A prefill chunk, or a decode of the last sampled token."""
        req = self.running[pick % len(self.running)]
        n = 1 + chunk % (req.num_tokens - req.num_computed_tokens)
        if self._allocate(req, n) is not None:
            self._commit(req, req.num_computed_tokens + n, token)

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def finish(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        self.kv.free(req)

    @precondition(lambda self: self.running)
    @rule(pick=PICK)
    def preempt(self, pick: int) -> None:
        req = self.running.pop(pick % len(self.running))
        self.kv.free(req)
        req.num_computed_tokens = 0
        self.waiting.append(req)

    @precondition(lambda self: self.running)
    @rule(pick=PICK, chunk=PICK)
    def preempt_scheduled(self, pick: int, chunk: int) -> None:
        """Preempted in the step that scheduled it: blocks published for this step were never written."""
        req = self.running.pop(pick % len(self.running))
        self._allocate(req, 1 + chunk % (req.num_tokens - req.num_computed_tokens))
        for b in self.kv.req_to_blocks[req.request_id][req.num_computed_tokens // self.bs:]:
            if b.block_hash is not None and self.written.get(b.block_id) != b.block_hash:
                self.published_unwritten[b.block_id] = b.block_hash
        self.kv.free(req)
        req.num_computed_tokens = 0
        self.waiting.append(req)

    @rule()
    def reset_prefix_cache(self) -> None:
        idle = not self.running
        before = snapshot(self.kv)
        assert self.kv.reset_prefix_cache() == idle, "reset must succeed exactly when nothing is held"
        if idle:
            assert not self.kv.block_pool.cached_block_hash_to_block
            assert all(b.block_hash is None for b in self.kv.block_pool.blocks)
        else:
            assert snapshot(self.kv) == before, "a refused reset changed the pool"

    @invariant()
    def pool_is_consistent(self) -> None:
        check_pool(self.kv)
        assert set(self.kv.req_to_blocks) == {r.request_id for r in self.running}

    @invariant()
    def requests_hold_exactly_their_computed_blocks(self) -> None:
        for req in self.running:
            blocks = self.kv.req_to_blocks[req.request_id]
            assert len(blocks) == -(-req.num_computed_tokens // self.bs), f"{req} holds the wrong block count"
            for i, b in enumerate(blocks[:req.num_computed_tokens // self.bs]):
                assert b.block_hash in (None, req.block_hashes[i]), f"{req} block {i} cached under another hash"

    @invariant()
    def cached_blocks_hold_written_kv(self) -> None:
        """Except the blocks vLLM 0.32 published for a step whose owner it preempted in that step."""
        pool = self.kv.block_pool
        for h in pool.cached_block_hash_to_block:
            for b in pool.cached_blocks(h):
                assert h in (self.written.get(b.block_id), self.published_unwritten.get(b.block_id)), (
                    f"{b} is cached but its KV was never computed")

    def teardown(self) -> None:
        if not hasattr(self, "kv"):
            return
        for req in self.running:
            self.kv.free(req)
        self.running.clear()
        check_pool(self.kv)
        pool = self.kv.block_pool
        assert pool.get_num_free_blocks() == pool.num_usable_blocks, "blocks leaked after freeing everything"
        assert self.kv.reset_prefix_cache()


KVCacheMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, derandomize=True,
                                            deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestKVCacheManagerKeepsBooksUnderRandomTraffic = KVCacheMachine.TestCase


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    block_size = draw(st.integers(2, 4))
    num_blocks = draw(st.integers(4, 16))
    usable_tokens = (num_blocks - 1) * block_size
    reqs = []
    for _ in range(draw(st.integers(2, 10))):
        prompt = draw(st.lists(st.integers(1, 3), min_size=1, max_size=min(16, usable_tokens)))
        room = usable_tokens - len(prompt)
        max_tokens = draw(st.integers(min(4, max(1, room)), max(1, min(24, room))))
        reqs.append((draw(st.integers(0, 6)), prompt, max_tokens))
    return dict(block_size=block_size, num_blocks=num_blocks, requests=reqs,
                budget=draw(st.integers(2, 24)), max_num_seqs=draw(st.integers(2, 8)),
                policy=draw(st.sampled_from(["fcfs", "priority"])),
                priorities=draw(st.lists(st.integers(0, 2), min_size=len(reqs), max_size=len(reqs))))


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), data=st.data())
def test_scheduler_on_tight_pool_terminates_without_leaking_blocks(w: dict, data: st.DataObject) -> None:
    sched = make_scheduler(num_blocks=w["num_blocks"], block_size=w["block_size"], max_num_seqs=w["max_num_seqs"],
                           max_num_batched_tokens=w["budget"], max_model_len=256, policy=w["policy"])
    arrivals = sorted(((at, i, p, m) for i, (at, p, m) in enumerate(w["requests"])), key=lambda a: a[:2])
    kv = sched.kv_cache_manager
    step_no = 0
    while arrivals or sched.has_unfinished_requests() or sched.has_pending_outputs():
        while arrivals and arrivals[0][0] <= step_no:
            _, i, prompt, max_tokens = arrivals.pop(0)
            sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens), eos_token_id=EOS,
                                      arrival_time=float(step_no), priority=w["priorities"][i]))
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= w["budget"]
        # EOS about one time in ten, so requests live long enough to crowd the pool.
        tokens = {rid: EOS if data.draw(st.integers(0, 9), label=f"token {rid}") == 0 else 3
                  for rid in out.num_scheduled_tokens}
        sched.update_from_output(out, fake_output(out, sched, tokens=tokens))
        for req in sched.requests.values():
            assert req.num_computed_tokens <= req.num_tokens, f"{req} computed more tokens than it has"
        for req in sched.waiting:
            assert req.request_id not in kv.req_to_blocks, f"waiting {req} still holds blocks"
        check_pool(kv)
        step_no += 1
        assert step_no < 2_000, "the scheduler did not terminate"
    pool = kv.block_pool
    assert not kv.req_to_blocks and pool.get_num_free_blocks() == pool.num_usable_blocks, "blocks leaked"
