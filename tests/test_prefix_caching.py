"""Block pool and prefix caching, re-created from what vLLM v1's prefix-caching tests check."""
import subprocess
import sys

from core_helpers import make_requests, make_scheduler, step

from engine.core import BlockPool, KVCacheManager, Request, RequestStatus, SamplingParams
from hypothesis import given
from hypothesis import strategies as st

from engine.core.hashing import hash_block_tokens, hash_request_tokens


def _manager(num_blocks=11, block_size=4, **kw):
    return KVCacheManager(num_blocks, block_size, max_model_len=1024, **kw)


def _req(rid, tokens, block_size=4, salt=None):
    return Request(rid, tokens, SamplingParams(max_tokens=8), eos_token_id=2, cache_salt=salt,
                   block_size=block_size)


def _admit(kv, req, num_tokens=None):
    hits, num_hit = kv.get_computed_blocks(req)
    blocks = kv.allocate_slots(req, (num_tokens or req.num_tokens) - num_hit, num_hit, hits)
    assert blocks is not None
    req.num_computed_tokens = num_hit + (num_tokens or req.num_tokens) - num_hit
    return hits, num_hit


def test_shared_prefix_hits_full_blocks_and_shares_ref_counts():
    kv = _manager()
    common = list(range(100, 112))  # 3 full blocks
    a = _req("a", common + [1, 2])
    _admit(kv, a)
    b = _req("b", common + [3])
    hits, num_hit = _admit(kv, b)
    assert num_hit == 12 and [blk.block_id for blk in hits] == kv.get_block_ids("a")[:3]
    assert all(blk.ref_cnt == 2 for blk in hits)
    assert kv.get_block_ids("b")[:3] == kv.get_block_ids("a")[:3]


def test_hit_is_capped_so_the_last_prompt_token_is_computed():
    kv = _manager()
    tokens = list(range(100, 112))
    _admit(kv, _req("a", tokens))
    _, num_hit = kv.get_computed_blocks(_req("b", tokens))
    assert num_hit == 8  # not 12: the last block holds the last token, which must be recomputed


def test_freed_blocks_stay_cached_until_reused():
    kv = _manager()
    tokens = list(range(100, 108))
    a = _req("a", tokens + [1])
    _admit(kv, a)
    kv.free(a)
    assert kv.block_pool.get_num_free_blocks() == 10
    _, num_hit = _admit(kv, _req("b", tokens + [5]))
    assert num_hit == 8


def test_cache_hit_on_a_free_block_takes_it_out_of_the_free_queue():
    kv = _manager()
    a = _req("a", list(range(100, 109)))
    _admit(kv, a)
    kv.free(a)
    b = _req("b", list(range(100, 108)) + [9])
    hits, _ = _admit(kv, b)
    free_ids = {blk.block_id for blk in kv.block_pool.free_block_queue.get_all_free_blocks()}
    assert not free_ids & {blk.block_id for blk in hits}
    assert all(blk.ref_cnt == 1 for blk in hits)


def test_free_queue_eviction_order():
    """Uncached blocks are reused first; cached ones go to the tail, a request's tail before its head."""
    pool = BlockPool(num_blocks=11)
    kv = _manager()
    kv.block_pool = pool
    a = _req("a", list(range(100, 110)))  # blocks: full, full, partial (2 tokens)
    _admit(kv, a)
    ids = kv.get_block_ids("a")
    kv.free(a)
    order = [blk.block_id for blk in pool.free_block_queue.get_all_free_blocks()]
    untouched = [i for i in range(1, 11) if i not in ids]
    assert order == [ids[2]] + untouched + [ids[1], ids[0]]


def test_a_released_pool_leaves_no_linked_block_behind():
    """BlockPool.release unlinks the free queue (neighbours reference each other: cycles for the garbage
    collector), cached and never-used blocks alike, and forgets the cache."""
    kv = _manager()
    a = _req("a", list(range(100, 110)))
    _admit(kv, a)
    kv.free(a)
    pool = kv.block_pool
    queue = pool.free_block_queue
    linked = [queue._head, queue._tail, *pool.blocks]
    pool.release()
    assert all(b.prev_free_block is None and b.next_free_block is None for b in linked)
    assert pool.cached_block_hash_to_block == {}


@given(st.lists(st.integers(1, 9), unique=True), st.lists(st.integers(10, 19), unique=True))
def test_append_n_links_blocks_as_appending_them_one_by_one(taken, returned):
    """A freed request's cached blocks go to the LRU tail in one pass (append_n): the same queue."""
    from engine.core.block_pool import FreeKVCacheBlockQueue, KVCacheBlock

    def queue_after(append_all):
        blocks = [KVCacheBlock(i) for i in range(20)]
        queue = FreeKVCacheBlockQueue(blocks)
        for i in taken + returned:
            queue.remove(blocks[i])
        append_all(queue, [blocks[i] for i in returned])
        return [b.block_id for b in queue.get_all_free_blocks()], queue.num_free_blocks

    one_by_one = queue_after(lambda q, bs: [q.append(b) for b in bs])
    assert queue_after(lambda q, bs: q.append_n(bs)) == one_by_one


def test_reused_block_loses_its_stale_hash():
    kv = _manager(num_blocks=4)  # 3 usable blocks
    a = _req("a", list(range(100, 109)))
    _admit(kv, a)
    kv.free(a)
    assert len(kv.block_pool.cached_block_hash_to_block) == 2
    b = _req("b", list(range(500, 512)))
    _admit(kv, b)
    assert kv.block_pool.cached_block_hash_to_block.keys().isdisjoint(a.block_hashes)
    assert kv.get_computed_blocks(_req("c", list(range(100, 109))))[1] == 0


def test_failed_allocation_leaves_everything_untouched():
    kv = _manager(num_blocks=5)  # 4 usable
    a = _req("a", list(range(100, 109)))
    _admit(kv, a)  # 3 blocks held
    kv.free(a)
    b = _req("b", list(range(100, 108)) + list(range(600, 620)))  # hits 2 cached blocks, needs 7 total
    hits, num_hit = kv.get_computed_blocks(b)
    before = ([blk.ref_cnt for blk in kv.block_pool.blocks],
              [blk.block_id for blk in kv.block_pool.free_block_queue.get_all_free_blocks()],
              dict(kv.block_pool.cached_block_hash_to_block))
    assert kv.allocate_slots(b, b.num_tokens - num_hit, num_hit, hits) is None
    after = ([blk.ref_cnt for blk in kv.block_pool.blocks],
             [blk.block_id for blk in kv.block_pool.free_block_queue.get_all_free_blocks()],
             dict(kv.block_pool.cached_block_hash_to_block))
    assert before == after and "b" not in kv.req_to_blocks


def test_failed_allocation_keeps_a_running_requests_computed_blocks():
    kv = _manager(num_blocks=4)
    a = _req("a", list(range(100, 108)))
    _admit(kv, a)
    held = kv.get_block_ids("a")
    b = _req("b", list(range(200, 204)))
    _admit(kv, b)  # pool now full
    assert kv.allocate_slots(a, 4) is None
    assert kv.get_block_ids("a") == held and all(kv.block_pool.blocks[i].ref_cnt == 1 for i in held)


def test_cache_salt_separates_equal_prefixes():
    kv = _manager()
    tokens = list(range(100, 109))
    _admit(kv, _req("a", tokens, salt="tenant-1"))
    assert kv.get_computed_blocks(_req("b", tokens, salt="tenant-2"))[1] == 0
    assert kv.get_computed_blocks(_req("c", tokens, salt="tenant-1"))[1] == 8
    assert kv.get_computed_blocks(_req("d", tokens))[1] == 0


def test_block_hashes_are_chained_and_equal_across_processes():
    tokens = list(range(100, 116))
    here = [h.hex() for h in hash_request_tokens(tokens, 4)]
    code = ("from engine.core.hashing import hash_request_tokens;"
            f"print(','.join(h.hex() for h in hash_request_tokens({tokens}, 4)))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip().split(",") == here
    # Same block content after a different prefix hashes differently.
    other = hash_request_tokens([1, 2, 3, 4] + tokens[4:8], 4)
    assert other[1] != hash_request_tokens(tokens, 4)[1]


def test_block_hashes_stay_what_earlier_traces_recorded():
    # Traces keep these hashes (block_events, snapshots): the bytes hashed must never change.
    assert hash_request_tokens(list(range(100, 116)), 4)[-1].hex() == "ade68886f81c444de7393469054b09b0"
    assert hash_request_tokens(list(range(100, 116)), 4, "t")[-1].hex() == "bb3e46bf7174565b6b46c3980c2d3126"


@given(st.lists(st.integers(0, 2**62), max_size=90), st.sampled_from([1, 2, 4, 16]),
       st.sampled_from([None, "tenant"]))
def test_request_hashes_equal_block_by_block(tokens, block_size, salt):
    """A request's prompt blocks are hashed when it is built, its decoded ones as they fill; both chain
    to the hashes of hash_block_tokens applied block by block."""
    extra = b"" if salt is None else b"\x00salt:" + salt.encode()
    one_by_one, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = hash_block_tokens(parent, tokens[i * block_size:(i + 1) * block_size], extra)
        one_by_one.append(parent)
    assert hash_request_tokens(tokens, block_size, salt) == one_by_one
    req = _req("r", tokens[:block_size * 2 + 1] or [5], block_size, salt)  # the prompt ...
    for tok in tokens[block_size * 2 + 1:]:
        req.append_output_token_ids(tok)  # ... then one block at a time
    assert req.block_hashes == hash_request_tokens(req.all_token_ids, block_size, salt)


def test_prefix_cache_stats_count_each_request_once():
    sched = make_scheduler(block_size=4, max_num_seqs=1)
    common = list(range(100, 108))
    reqs = make_requests(3, num_tokens=10, prefix=common)
    for r in reqs:
        sched.add_request(r)
    queries = hits = requests = 0
    while sched.has_unfinished_requests():
        _, outs = step(sched)
        s = outs.scheduler_stats.prefix_cache_stats
        queries, hits, requests = queries + s.queries, hits + s.hits, requests + s.requests
    assert requests == 3 and queries == 30 and hits == 16  # the 2nd and 3rd hit 8 tokens each


def test_preempted_readmission_is_counted_separately():
    sched = make_scheduler(num_blocks=6, block_size=16, max_model_len=80)
    a, b = make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    preempted_requests = 0
    requests = 0
    while sched.has_unfinished_requests():
        _, outs = step(sched)
        preempted_requests += outs.scheduler_stats.prefix_cache_stats.preempted_requests
        requests += outs.scheduler_stats.prefix_cache_stats.requests
    assert requests == 2 and preempted_requests == b.num_preemptions >= 1


def test_reset_prefix_cache_is_refused_while_requests_hold_blocks():
    sched = make_scheduler(block_size=4)
    req, = make_requests(1, num_tokens=9)
    sched.add_request(req)
    step(sched)
    assert not sched.reset_prefix_cache()
    assert sched.kv_cache_manager.block_pool.cached_block_hash_to_block
    sched.finish_requests([req.request_id], RequestStatus.FINISHED_ABORTED)
    assert sched.reset_prefix_cache()
    assert not sched.kv_cache_manager.block_pool.cached_block_hash_to_block
    assert all(b.block_hash is None for b in sched.kv_cache_manager.block_pool.blocks)


def test_decode_publishes_a_block_once_it_fills():
    sched = make_scheduler(block_size=4)
    req, = make_requests(1, num_tokens=6, max_tokens=10)
    sched.add_request(req)
    pool = sched.kv_cache_manager.block_pool
    step(sched)
    assert len(pool.cached_block_hash_to_block) == 1
    step(sched)  # computes token 6 (the first output), appends the 8th token
    step(sched)  # computes token 7: block 2 is full and published
    assert len(pool.cached_block_hash_to_block) == 2


def test_second_request_in_the_same_step_hits_the_first_ones_blocks():
    sched = make_scheduler(block_size=4)
    a, b = make_requests(2, num_tokens=12, same_prompt=True)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {a.request_id: 12, b.request_id: 4}
    assert out.prefix_hit_tokens == 8 and b.num_cached_tokens == 8


def test_free_keeps_hashes_published_at_allocation_as_vllm_does():
    """vLLM 0.32 publishes blocks when a step's tokens are allocated and never takes a hash back on free,
    even if the step never ran (its owner preempted in the same step): the blocks join the LRU tail."""
    kv = _manager()
    req = _req("a", list(range(100, 109)))
    kv.allocate_slots(req, 9)        # publishes blocks 0 and 1 at allocation time
    held = kv.get_block_ids("a")
    kv.free(req)                     # freed before the step ran: num_computed_tokens is still 0
    assert len(kv.block_pool.cached_block_hash_to_block) == 2
    tail = [b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()[-2:]]
    assert tail == [held[1], held[0]]
