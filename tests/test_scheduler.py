"""Scheduler behaviour, re-created from what vLLM v1's scheduler tests check."""
from core_helpers import EOS, fake_output, make_requests, make_scheduler, run_to_completion, step

from engine.core import RequestStatus


def test_add_request_queues_it_waiting():
    sched = make_scheduler()
    (req,) = make_requests(1)
    sched.add_request(req)
    assert req.request_id in sched.requests
    assert len(sched.waiting) == 1 and req.status == RequestStatus.WAITING


def test_finish_request_removes_it_and_frees_blocks():
    sched = make_scheduler()
    reqs = make_requests(3)
    for r in reqs:
        sched.add_request(r)
    sched.schedule()
    sched.finish_requests([reqs[1].request_id], RequestStatus.FINISHED_ABORTED)
    assert reqs[1].request_id not in sched.requests
    assert reqs[1] not in sched.running and reqs[1].status == RequestStatus.FINISHED_ABORTED
    assert sched.kv_cache_manager.get_block_ids(reqs[1].request_id) == []
    assert reqs[1].request_id in sched.schedule().finished_req_ids


def test_abort_of_waiting_request_removes_it_from_queue():
    sched = make_scheduler(max_num_seqs=1)
    reqs = make_requests(2)
    for r in reqs:
        sched.add_request(r)
    sched.schedule()
    sched.finish_requests([reqs[1].request_id], RequestStatus.FINISHED_ABORTED)
    assert len(sched.waiting) == 0 and sched.get_num_unfinished_requests() == 1


def test_all_new_requests_are_scheduled_in_arrival_order():
    sched = make_scheduler()
    reqs = make_requests(10)
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == [r.request_id for r in reqs]
    assert out.scheduled_cached_reqs.num_reqs == 0
    assert all(out.num_scheduled_tokens[r.request_id] == 10 for r in reqs)
    assert len(sched.running) == 10 and len(sched.waiting) == 0


def test_concurrent_partial_prefills_share_the_budget_under_the_threshold():
    sched = make_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    reqs = make_requests(3, num_tokens=800)
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert len(out.scheduled_new_reqs) == 3
    assert [out.num_scheduled_tokens[r.request_id] for r in reqs] == [400, 400, 224]
    sched.update_from_output(out, fake_output(out, sched))
    out = sched.schedule()
    assert out.scheduled_cached_reqs.num_reqs == 3 and len(out.scheduled_new_reqs) == 0
    assert [out.num_scheduled_tokens[r.request_id] for r in reqs] == [400, 400, 224]
    sched.update_from_output(out, fake_output(out, sched))
    out = sched.schedule()
    assert [out.num_scheduled_tokens[r.request_id] for r in reqs] == [1, 1, 800 - 224 - 224]
    assert out.decode_req_ids == {reqs[0].request_id, reqs[1].request_id}


def test_prefill_and_decode_are_mixed_in_one_step():
    sched = make_scheduler()
    (first,) = make_requests(1, num_tokens=20)
    sched.add_request(first)
    step(sched)
    (second,) = make_requests(1, num_tokens=30, start=1)
    sched.add_request(second)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {first.request_id: 1, second.request_id: 30}
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 30


def test_no_skipping_ahead_when_chunked_prefill_is_off():
    sched = make_scheduler(max_num_batched_tokens=100, max_model_len=100, enable_chunked_prefill=False)
    big, small = make_requests(1, num_tokens=80) + make_requests(1, num_tokens=30, start=1)
    running, = make_requests(1, num_tokens=30, start=2)
    sched.add_request(running)
    step(sched)
    sched.add_request(big)
    sched.add_request(small)
    out = sched.schedule()
    # The decode takes 1 token; 80 still fits in the remaining 99, then 30 does not fit in 19.
    assert out.num_scheduled_tokens == {running.request_id: 1, big.request_id: 80}
    sched.update_from_output(out, fake_output(out, sched))
    out = sched.schedule()
    assert small.request_id in out.num_scheduled_tokens


def test_waiting_request_that_does_not_fit_blocks_those_behind_it_without_chunking():
    sched = make_scheduler(max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False)
    a, = make_requests(1, num_tokens=40)
    b, c = make_requests(2, num_tokens=30, start=1)
    for r in (a, b, c):
        sched.add_request(r)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == [a.request_id]


def test_chunked_prefill_splits_a_long_prompt_over_steps():
    sched = make_scheduler(max_num_batched_tokens=64)
    req, = make_requests(1, num_tokens=150)
    sched.add_request(req)
    chunks = []
    while not req.output_token_ids:
        out, _ = step(sched)
        chunks.append(out.num_scheduled_tokens[req.request_id])
    assert chunks == [64, 64, 22]


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=3)
    for r in make_requests(5):
        sched.add_request(r)
    out = sched.schedule()
    assert len(out.num_scheduled_tokens) == 3 and len(sched.waiting) == 2


def test_preemption_during_execution_resumes_the_victim_and_finishes_it():
    # 2 requests of 16 prompt tokens, blocks of 16, 5 usable blocks: both grow until one is evicted.
    sched = make_scheduler(num_blocks=6, block_size=16, max_model_len=80)
    a, b = make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    preempted_steps = []
    resumed = False
    steps = 0
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        steps += 1
        if out.preempted_req_ids:
            preempted_steps.append((steps, out.preempted_req_ids))
        resumed |= any(out.scheduled_cached_reqs.resumed_from_preemption)
    assert preempted_steps and preempted_steps[0][1] == [b.request_id]  # the newest running request
    assert resumed
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert a.num_output_tokens == b.num_output_tokens == 40
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 5


def test_resumed_request_recomputes_prompt_and_outputs():
    sched = make_scheduler(num_blocks=6, block_size=16, max_model_len=80, enable_prefix_caching=False)
    a, b = make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    while True:
        out, _ = step(sched)
        if b.request_id in out.preempted_req_ids:
            break
    tokens_before = b.num_tokens
    while True:
        out, _ = step(sched)
        cached = out.scheduled_cached_reqs
        if b.request_id in cached.req_ids:
            k = cached.req_ids.index(b.request_id)
            assert cached.resumed_from_preemption[k]
            assert cached.resumed_token_ids[k] == b.all_token_ids[:tokens_before]
            assert out.num_scheduled_tokens[b.request_id] == tokens_before
            break


def test_no_new_admissions_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=6, block_size=16, max_model_len=80)
    a, b = make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    c, = make_requests(1, num_tokens=4, start=2)
    while True:
        out = sched.schedule()
        if out.preempted_req_ids:
            assert not out.scheduled_new_reqs
            break
        sched.update_from_output(out, fake_output(out, sched))
        if b.num_output_tokens == 30 and c.request_id not in sched.requests:
            sched.add_request(c)


def test_teaching_scenario_three_blocks_of_ten_preempts_the_tail():
    """The seeds' notebook: 3 blocks of 10 tokens; growing requests evict the tail, which re-queues first."""
    sched = make_scheduler(num_blocks=4, block_size=10, max_model_len=30, enable_prefix_caching=False)
    reqs = [make_requests(1, num_tokens=n, max_tokens=20, ignore_eos=True, start=i)[0]
            for i, n in enumerate((9, 6, 3))]
    for r in reqs:
        sched.add_request(r)
    out, _ = step(sched)
    assert len(out.scheduled_new_reqs) == 3  # one block each
    while True:
        out, _ = step(sched)
        if out.preempted_req_ids:
            break
    assert out.preempted_req_ids == [reqs[2].request_id]
    assert sched.waiting.peek_request() is reqs[2]
    assert reqs[2].status == RequestStatus.PREEMPTED and reqs[2].num_computed_tokens == 0
    run_to_completion(sched)
    assert [r.num_output_tokens for r in reqs] == [20, 20, 20]


def test_stop_on_eos():
    sched = make_scheduler()
    req, = make_requests(1, max_tokens=10)
    sched.add_request(req)
    step(sched)
    _, outs = step(sched, token=EOS)
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert outs.outputs[0].finish_reason == "stop" and outs.outputs[0].new_token_ids == [EOS]
    assert not sched.has_unfinished_requests()


def test_ignore_eos_keeps_generating():
    sched = make_scheduler()
    req, = make_requests(1, max_tokens=5, ignore_eos=True)
    sched.add_request(req)
    for _ in range(5):
        step(sched, token=EOS)
    assert req.num_output_tokens == 5 and req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_stop_token_id_ends_request_with_stop_reason():
    sched = make_scheduler()
    req, = make_requests(1, max_tokens=10, stop_token_ids=[42])
    sched.add_request(req)
    step(sched)
    _, outs = step(sched, token=42)
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == 42
    assert outs.outputs[0].stop_reason == 42


def test_max_tokens_caps_length():
    sched = make_scheduler()
    req, = make_requests(1, max_tokens=3)
    sched.add_request(req)
    for _ in range(3):
        _, outs = step(sched)
    assert req.output_token_ids == [7, 7, 7]
    assert outs.outputs[0].finish_reason == "length"


def test_min_tokens_suppresses_early_eos():
    sched = make_scheduler()
    req, = make_requests(1, max_tokens=10, min_tokens=3)
    sched.add_request(req)
    for _ in range(2):
        step(sched, token=EOS)
    assert req.status == RequestStatus.RUNNING
    step(sched, token=EOS)
    assert req.status == RequestStatus.FINISHED_STOPPED and req.num_output_tokens == 3


def test_max_model_len_caps_length():
    sched = make_scheduler(max_model_len=14)
    req, = make_requests(1, num_tokens=10, max_tokens=100)
    sched.add_request(req)
    run_to_completion(sched)
    assert req.num_tokens == 14 and req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def _admission_order(priorities, arrival_times):
    """Requests admitted one at a time (max_num_seqs=1) under the priority policy, in order."""
    sched = make_scheduler(policy="priority", max_num_seqs=1)
    for r in make_requests(3, priorities=priorities, arrival_times=arrival_times):
        sched.add_request(r)
    order = []
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        order += [n.req_id for n in out.scheduled_new_reqs]
    return order


def test_priority_orders_waiting_requests_lowest_value_first():
    assert _admission_order([5, 1, 3], [0.0, 1.0, 2.0]) == ["r1", "r2", "r0"]


def test_priority_ties_break_on_arrival_time():
    assert _admission_order([2, 2, 2], [3.0, 1.0, 2.0]) == ["r1", "r2", "r0"]


def test_priority_preemption_evicts_lowest_priority_then_resumes_it():
    sched = make_scheduler(policy="priority", num_blocks=6, block_size=16, max_model_len=80)
    # The low-priority request is admitted FIRST, so FCFS would evict the other one.
    low, high = make_requests(2, num_tokens=16, max_tokens=40, ignore_eos=True, priorities=[9, 0],
                              arrival_times=[0.0, 1.0])
    sched.add_request(low)
    step(sched)
    sched.add_request(high)
    first_preempted = None
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        if out.preempted_req_ids and first_preempted is None:
            first_preempted = out.preempted_req_ids
    assert first_preempted == [low.request_id]
    assert high.num_preemptions == 0 and low.num_preemptions >= 1
    assert low.num_output_tokens == 40 and high.num_output_tokens == 40


def test_request_longer_than_max_model_len_is_rejected_with_a_reason():
    sched = make_scheduler(max_model_len=32)
    bad, = make_requests(1, num_tokens=40)
    good, = make_requests(1, num_tokens=8, start=1)
    assert not sched.add_request(bad)
    assert sched.add_request(good)
    _, outs = step(sched)
    errors = [o for o in outs.outputs if o.finish_reason == "error"]
    assert [o.request_id for o in errors] == [bad.request_id]
    assert "max_model_len" in errors[0].stop_reason
    run_to_completion(sched)
    assert good.status.finished


def test_request_needing_more_blocks_than_the_pool_is_rejected():
    sched = make_scheduler(num_blocks=4, block_size=16, max_model_len=1000)
    req, = make_requests(1, num_tokens=20, max_tokens=100)
    assert not sched.add_request(req)
    assert "KV blocks" in req.error and req.status == RequestStatus.FINISHED_ERROR
    assert not sched.has_unfinished_requests()


def test_empty_prompt_is_rejected():
    sched = make_scheduler()
    req, = make_requests(1, num_tokens=0)
    assert not sched.add_request(req)
    assert req.error == "prompt is empty"


def test_new_request_data_then_only_diffs():
    sched = make_scheduler(block_size=4)
    req, = make_requests(1, num_tokens=6)
    sched.add_request(req)
    out, _ = step(sched)
    new = out.scheduled_new_reqs[0]
    assert new.prompt_token_ids == req.prompt_token_ids and len(new.block_ids) == 2
    assert new.num_computed_tokens == 0
    out, _ = step(sched)
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == [req.request_id] and cached.new_block_ids == [[]]
    assert cached.num_computed_tokens == [6] and cached.resumed_token_ids == [None]
    out, _ = step(sched)
    out, _ = step(sched)  # token 9 needs a third block
    assert len(out.scheduled_cached_reqs.new_block_ids[0]) == 1


def test_scheduler_stats_report_queue_and_usage():
    sched = make_scheduler(max_num_seqs=2, num_blocks=11, block_size=16)
    for r in make_requests(3, num_tokens=16):
        sched.add_request(r)
    _, outs = step(sched)
    stats = outs.scheduler_stats
    assert stats.num_running_reqs == 2 and stats.num_waiting_reqs == 1
    assert abs(stats.kv_cache_usage - 2 / 10) < 1e-9  # one 16-token block each


def test_outcome_does_not_depend_on_the_runners_row_order():
    """Runners may arrange their batch as they like (ours sorts decodes by length): finishes, and so
    the free queue and later block ids, must follow the scheduler's own order."""
    from engine.core import ModelRunnerOutput

    def run(reverse: bool) -> list:
        sched = make_scheduler(block_size=4, num_blocks=40)
        for r in make_requests(6, num_tokens=6, max_tokens=3, ignore_eos=True):
            sched.add_request(r)
        for r in make_requests(4, num_tokens=5, max_tokens=4, ignore_eos=True, start=6):
            sched.add_request(r)
        history = []
        while sched.has_unfinished_requests():
            out = sched.schedule()
            mro = fake_output(out, sched)
            if reverse:
                mro = ModelRunnerOutput(mro.req_ids[::-1], mro.sampled_token_ids[::-1])
            outs = sched.update_from_output(out, mro)
            history.append(([o.request_id for o in outs.outputs], out.scheduled_cached_reqs.new_block_ids,
                            [n.block_ids for n in out.scheduled_new_reqs]))
        return history

    assert run(False) == run(True)
