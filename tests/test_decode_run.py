"""engine.core.decode_run: a decode-only run leaves the scheduler exactly as the same steps taken one by one
through schedule() and update_from_output(), under each policy and option that shapes a step."""
import zlib

import pytest
from core_helpers import make_requests, make_scheduler

from engine.core import ModelRunnerOutput, RequestStatus
from engine.core.async_scheduler import make_scheduler as make_any_scheduler
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.decode_run import DecodeRun, rewind_decode_steps


def token(rid: str, pos: int) -> int:
    return 100 + zlib.crc32(f"{rid}:{pos}".encode()) % 30_000


def upcoming(requests, count: int) -> list[list[int]]:
    return [[token(r.request_id, p) for p in range(len(r.output_token_ids), len(r.output_token_ids) + count)]
            for r in requests]


def one_step(sched):
    out = sched.schedule()
    ids, sampled = [], []
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        ids.append(rid)
        sampled.append([] if req.is_prefill_chunk else [token(rid, len(req.output_token_ids))])
    sched.update_from_output(out, ModelRunnerOutput(ids, sampled))
    return out


def state(sched):
    """Everything a later step reads. Block hashes are brought up to date first: update_from_output leaves
    a filled block's hash until it is read, a run hashes it as it fills (a hash once made never changes)."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    for r in sched.requests.values():
        r.update_block_hashes()
    reqs = {rid: (list(r.output_token_ids), list(r.all_token_ids), r.num_computed_tokens, list(r.block_hashes),
                  kv.get_block_ids(rid), r.status) for rid, r in sched.requests.items()}
    cached = {h: sorted(b.block_id for b in pool.cached_blocks(h)) for h in pool.cached_block_hash_to_block}
    return (reqs, [b.block_id for b in pool.free_block_queue.get_all_free_blocks()], cached, dict(kv.slot_limit),
            set(sched.finished_req_ids), [r.request_id for r in sched.running], pool.num_evictions)


def take(run: DecodeRun) -> int:
    """The run's steps in order, each after its crossings, up to the first step the pool is short for."""
    done = 0
    while done < run.steps:
        if done in run.crossings and not run.cross(done):
            break
        done += 1
    run.end(done)
    return done


def in_decode_stretch(num_blocks=400, prompt_len=23, **options):
    """A scheduler whose six requests have all been prefilled (one by one) and decode from here on."""
    priorities = [3, 1, 2, 0, 1, 2] if options.get("policy") == "priority" else None
    sched = make_scheduler(num_blocks=num_blocks, block_size=4, max_num_batched_tokens=64, **options)
    for i in range(6):  # prompts of different lengths cross their blocks at different steps
        sched.add_request(make_requests(1, num_tokens=prompt_len + 3 * i, max_tokens=200, start=i, ignore_eos=True,
                                        priorities=priorities and priorities[i:i + 1])[0])
    for _ in range(100):
        if sched.decode_only():
            return sched
        one_step(sched)
    raise AssertionError("never reached a decode-only stretch")


CASES = {"fcfs": {}, "priority": {"policy": "priority"}, "watermark": {"watermark": 0.1},
         "long_prefill_threshold": {"long_prefill_token_threshold": 8},
         "no_prefix_caching": {"enable_prefix_caching": False}}


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_a_run_leaves_the_scheduler_as_the_same_steps_taken_one_by_one(options):
    a, b = in_decode_stretch(**options), in_decode_stretch(**options)
    run = DecodeRun.plan(a, 60, upcoming)
    done = take(run)
    assert done == 60 and run.gained  # long enough to cross blocks several times
    for _ in range(done):
        one_step(b)
    assert state(a) == state(b)


def test_a_run_stops_before_the_step_the_pool_is_short_for_where_the_scheduler_preempts():
    a, b = in_decode_stretch(num_blocks=60), in_decode_stretch(num_blocks=60)
    run = DecodeRun.plan(a, 60, upcoming)
    done = take(run)
    assert 0 < done < run.steps
    for _ in range(done):
        one_step(b)
    assert state(a) == state(b)
    assert one_step(b).preempted_req_ids


def test_finishes_left_to_announce_are_announced_by_the_runs_first_step():
    a, b = in_decode_stretch(), in_decode_stretch()
    for sched in (a, b):
        sched.finish_requests([sched.running[1].request_id], RequestStatus.FINISHED_ABORTED)
        assert sched.finished_req_ids and sched.decode_only()
    take(DecodeRun.plan(a, 10, upcoming))
    for _ in range(10):
        one_step(b)
    assert state(a) == state(b) and not a.finished_req_ids

def test_a_run_ends_before_a_token_that_may_stop_a_request():
    sched = in_decode_stretch()
    req = sched.running[2]
    pos = len(req.output_token_ids) + 5
    req.stop_token_set = frozenset({token(req.request_id, pos)})
    assert DecodeRun.plan(sched, 60, upcoming).steps == 5


def test_a_run_ends_before_the_step_that_reaches_a_requests_length_limit():
    sched = in_decode_stretch()
    req = sched.running[0]
    req.num_tokens_limit = len(req.all_token_ids) + 8
    assert DecodeRun.plan(sched, 60, upcoming).steps == 7


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_request_waiting_behind_taken_seats_leaves_a_run_as_the_same_steps_taken_one_by_one(policy):
    """Every seat taken (max_num_seqs 6): the waiting request is not looked at until a seat frees."""
    a, b = in_decode_stretch(max_num_seqs=6, policy=policy), in_decode_stretch(max_num_seqs=6, policy=policy)
    for sched in (a, b):
        sched.add_request(make_requests(1, num_tokens=9, start=50)[0])
    assert a.decode_only()
    run = DecodeRun.plan(a, 60, upcoming)
    assert run.num_waiting == 1 and run.admission_stop == ("r50", "max_num_seqs", 0, 0)
    done = take(run)
    assert done == 60
    stops = {one_step(b).admission_stop for _ in range(done)}
    assert state(a) == state(b) and [r.request_id for r in a.waiting] == [r.request_id for r in b.waiting]
    assert stops == {run.admission_stop}


def test_no_run_while_a_request_waits_for_a_free_seat_or_under_async_scheduling():
    sched = in_decode_stretch()
    sched.add_request(make_requests(1, num_tokens=5, start=50)[0])
    assert not sched.decode_only()
    cfg = SchedulerConfig(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64, async_scheduling=True)
    async_sched = make_any_scheduler(cfg, CacheConfig(block_size=4, num_gpu_blocks=100), clock=lambda: 0.0)
    async_sched.add_request(make_requests(1, num_tokens=5)[0])
    for _ in range(3):
        out = async_sched.schedule()
        assert not async_sched.decode_only()
        async_sched.update_from_output(out, ModelRunnerOutput(list(out.num_scheduled_tokens), [[7]] * len(out.num_scheduled_tokens)))


def test_rewinding_a_run_takes_back_its_tokens_counts_and_hashes():
    sched = in_decode_stretch()
    for r in sched.running:
        r.update_block_hashes()
    before = {r.request_id: (list(r.all_token_ids), r.num_computed_tokens, list(r.block_hashes)) for r in sched.running}
    run = DecodeRun.plan(sched, 30, upcoming)
    take(run)
    rewind_decode_steps(run.running, 30)
    assert {r.request_id: (list(r.all_token_ids), r.num_computed_tokens, list(r.block_hashes))
            for r in sched.running} == before
    assert all(len(r.output_token_ids) == len(r.all_token_ids) - r.num_prompt_tokens for r in sched.running)

