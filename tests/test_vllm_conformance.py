"""engine.core decides every step exactly as vLLM 0.32's own Scheduler and AsyncScheduler do.

Both schedulers run side by side (see tests/vllm_harness.py) on hypothesis-generated streams: arrivals
over time, prompts from one token to several blocks, shared prefixes, tight KV pools that force
preemption, small token budgets that force chunking, FCFS and priority, EOS and length stops. Each tick
must schedule the same requests with the same token counts, preempt and finish the same requests and
leave every request the same block ids. Skipped only where vLLM is not installed (CI installs it).
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from vllm_harness import (OurSide, Run, Setup, Spec, VllmSide, drive, first_divergence,  # noqa: E402
                                streams, vllm_module)

EXAMPLES = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def _vllm_config() -> None:
    """Build vLLM's config once per module (its ModelConfig alone takes seconds)."""
    vllm_module()


def _assert_same(setup: Setup, specs: list[Spec]) -> Run:
    """Both sides log the same ticks; returns vLLM's log for checks on what happened."""
    ours, theirs = drive(OurSide(setup), specs, setup.async_scheduling), drive(VllmSide(setup), specs,
                                                                                 setup.async_scheduling)
    divergence = first_divergence(theirs, ours)
    assert divergence is None, f"first diverging step of\n{setup}\n{specs}\n{divergence}"
    return theirs


@EXAMPLES
@given(streams(async_scheduling=False))
def test_sync_scheduler_decides_as_vllm_step_for_step(case: tuple[Setup, list[Spec]]) -> None:
    _assert_same(*case)


@EXAMPLES
@given(streams(async_scheduling=True))
def test_async_scheduler_decides_as_vllm_in_batch_queue_order(case: tuple[Setup, list[Spec]]) -> None:
    _assert_same(*case)


def test_full_sequence_admission_waits_for_room_for_the_whole_prompt() -> None:
    """Two 24-token prompts, 8 tokens a step, 10 usable blocks of 4: vLLM 0.32 admits the second only
    once the pool can hold all 6 of its blocks, not when its first chunk would fit."""
    setup = Setup(block_size=4, num_blocks=11, max_num_batched_tokens=8, max_model_len=40,
                  enable_prefix_caching=False)
    specs = [Spec(0, tuple(range(10, 34)), 8, ignore_eos=True), Spec(0, tuple(range(40, 64)), 8, ignore_eos=True)]
    run = _assert_same(setup, specs)
    first_r1 = next(log.tick for log in run.logs if any(rid == "r1" for rid, _ in log.scheduled or ()))
    first_r0_done = next(log.tick for log in run.logs if log.finished)
    assert first_r1 > first_r0_done


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_preemption_and_resumption_match_vllm(async_scheduling: bool) -> None:
    setup = Setup(block_size=2, num_blocks=9, max_num_batched_tokens=16, max_model_len=16, max_num_seqs=4,
                  async_scheduling=async_scheduling)
    specs = [Spec(0, tuple(range(10, 14)), 10, ignore_eos=True), Spec(0, tuple(range(20, 24)), 10, ignore_eos=True)]
    run = _assert_same(setup, specs)
    assert any(log.preempted for log in run.logs)


def test_harness_notices_a_different_decision() -> None:
    """The comparison can fail: a stream that differs on one side is reported at its first tick."""
    setup = Setup()
    a = drive(VllmSide(setup), [Spec(0, tuple(range(10, 20)), 3, ignore_eos=True)], False)
    b = drive(OurSide(setup), [Spec(0, tuple(range(10, 19)), 3, ignore_eos=True)], False)
    assert first_divergence(a, b).startswith("tick 0:")
