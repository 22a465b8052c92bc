"""The scheduler says why it stopped admitting waiting requests and whom each preemption served."""
from __future__ import annotations

from core_helpers import make_requests, make_scheduler, step

from engine.core import CacheConfig, Scheduler, SchedulerConfig, SchedulerOutput


def _admit(sched: Scheduler, *reqs) -> None:
    for r in reqs:
        assert sched.add_request(r)


def _step_until_preemption(sched: Scheduler, max_steps: int = 40) -> SchedulerOutput:
    """Steps `sched` until a step preempts, or `max_steps` steps have passed; that last step's output."""
    for _ in range(max_steps):
        out, _ = step(sched)
        if out.preempted_req_ids:
            break
    return out


def _small_pool(reserve_full_isl: bool) -> Scheduler:
    """4 usable blocks of 16 tokens, chunked prefill on; a budget that leaves the second request a chunk
    when the whole sequence must fit, and its whole prompt otherwise."""
    sc = SchedulerConfig(max_model_len=8192, max_num_seqs=16, max_num_batched_tokens=50 if reserve_full_isl else 100,
                         scheduler_reserve_full_isl=reserve_full_isl)
    return Scheduler(sc, CacheConfig(block_size=16, num_gpu_blocks=5, enable_prefix_caching=False),
                     clock=lambda: 0.0)


def test_spent_token_budget_is_the_reason_for_the_queue_front():
    sched = make_scheduler(max_num_batched_tokens=20)
    _admit(sched, *make_requests(2, num_tokens=20))
    assert sched.schedule().admission_stop == ("r1", "token_budget", 0, 0)


def test_full_seats_are_the_reason_when_max_num_seqs_is_reached():
    sched = make_scheduler(max_num_seqs=1)
    _admit(sched, *make_requests(2, num_tokens=10))
    assert sched.schedule().admission_stop == ("r1", "max_num_seqs", 0, 0)


def test_full_sequence_admission_names_blocks_needed_and_free():
    sched = _small_pool(reserve_full_isl=True)
    _admit(sched, *make_requests(2, num_tokens=40, max_tokens=8))
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["r0"]
    assert out.admission_stop == ("r1", "full_sequence", 3, 1)


def test_kv_short_names_blocks_needed_and_free_for_the_chunk():
    sched = _small_pool(reserve_full_isl=False)
    _admit(sched, *make_requests(2, num_tokens=40, max_tokens=8))
    assert sched.schedule().admission_stop == ("r1", "kv_short", 3, 1)


def test_prompt_over_the_budget_without_chunked_prefill_names_tokens_needed_and_left():
    sched = make_scheduler(max_num_batched_tokens=50, max_model_len=50, enable_chunked_prefill=False)
    _admit(sched, *make_requests(2, num_tokens=40, max_tokens=5))
    assert sched.schedule().admission_stop == ("r1", "no_chunk", 40, 10)


def test_preemption_names_the_request_it_made_room_for_and_a_preempting_step_admits_nobody():
    sched = make_scheduler(num_blocks=5, block_size=16, enable_prefix_caching=False)
    _admit(sched, *make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True))
    out = _step_until_preemption(sched)
    assert out.preempted_req_ids == ["r1"]
    assert out.preempted_for == {"r1": ("r0", 1, 0)}
    assert out.admission_stop == ("r1", "preempted", 0, 0)


def test_a_step_with_nobody_waiting_records_no_reason():
    sched = make_scheduler()
    _admit(sched, *make_requests(2, num_tokens=10))
    step(sched)
    out = sched.schedule()
    assert out.admission_stop is None and out.preempted_for is None


def test_the_newest_running_request_that_cannot_grow_is_preempted_for_itself():
    sched = make_scheduler(num_blocks=5, block_size=16, enable_prefix_caching=False)
    r0 = make_requests(1, num_tokens=16, max_tokens=40, ignore_eos=True)[0]
    r1 = make_requests(1, num_tokens=20, max_tokens=40, ignore_eos=True, start=1)[0]
    _admit(sched, r0, r1)
    out = _step_until_preemption(sched)
    assert out.preempted_req_ids == ["r1"]
    assert out.preempted_for == {"r1": ("r1", 1, 0)}
