"""At a step where two runs decide differently, the TUI says why, from what each run carried into the
step (tui.compare.divergence_causes: no widgets), offers keys to the step where the clocks and the KV
pools first parted, and shows each reason whole, saying what full-sequence admission counts."""
from __future__ import annotations

import asyncio

import pytest

from core_helpers import fake_output, make_requests, make_scheduler
from test_tui_reasons import record_waits
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from tui import reasons
from tui.app import StepscopeApp
from tui.compare import Comparison, divergence_causes
from tui.loader import open_trace
from tui.model import RunIndex
from tui.widgets.vtable import VTable
from recording import record_step
from trace_builders import steps_as_requests_arrive

META = {"source": "sim", "config": {"model": {"architecture": "Fixture"}, "scheduler": {"policy": "fcfs"}},
        "device": {"type": "cpu"}, "workload": {"name": "fixture"}, "cost_model": {"name": "fixed"}}


def record(path, arrivals, step_ms=lambda step: 10.0, max_num_seqs=4, num_requests=3) -> RunIndex:
    """Requests of 8 prompt tokens and 6 output tokens arriving at `arrivals` (s), steps lasting
    `step_ms(step)`: the scheduler takes in whatever has arrived when a step starts."""
    now = [0.0]
    sched = make_scheduler(num_blocks=64, block_size=4, max_model_len=64, max_num_seqs=max_num_seqs)
    sched.clock = lambda: now[0]
    rec = TraceRecorder(TraceWriter(path, META), sched)
    pending = make_requests(num_requests, num_tokens=8, max_tokens=6, ignore_eos=True, arrival_times=arrivals)
    for step in steps_as_requests_arrive(sched, rec, pending, now):
        start, out = now[0], sched.schedule()
        now[0] = end = start + step_ms(step) / 1e3
        record_step(rec, out, sched.update_from_output(out, fake_output(out, sched)), start, end, 0.0, end - start, 0.0)
    rec.close()
    return RunIndex(open_trace(path), path.name.upper())


@pytest.fixture(scope="module")
def clock_ahead(tmp_path_factory):
    """Same requests; from step 2 on, B's steps take 4 ms instead of 10, so B reaches step 4 at 28 ms,
    before r2 arrives at 35 ms, and A at 40 ms, after it."""
    root = tmp_path_factory.mktemp("clock")
    arrivals = [0.0, 0.0, 0.035]
    a = record(root / "a", arrivals)
    b = record(root / "b", arrivals, step_ms=lambda step: 10.0 if step < 2 else 4.0)
    return Comparison(a, b)


@pytest.fixture(scope="module")
def fewer_seats(tmp_path_factory):
    """Four requests at once; A seats three, B two."""
    root = tmp_path_factory.mktemp("seats")
    a = record(root / "a", [0.0] * 4, max_num_seqs=3, num_requests=4)
    b = record(root / "b", [0.0] * 4, max_num_seqs=2, num_requests=4)
    return Comparison(a, b)


def _texts(cmp: Comparison, pos: int, kind: str | None = None) -> list[str]:
    return [c.text for c in divergence_causes(cmp.a, cmp.b, pos) if kind in (None, c.kind)]


def test_a_request_not_yet_arrived_because_the_other_clock_ran_ahead_is_the_cause(clock_ahead):
    first = clock_ahead.first_divergence
    assert first == 4
    (why,) = _texts(clock_ahead, first, "arrival")
    assert why == ("r2 had not yet arrived in B (it reached B's scheduler at 0.0360 s): B's clock ran 12.0 ms ahead "
                   "of A's (step 4 started at 0.0280 s in B, 0.0400 s in A)")


def test_the_cause_tells_where_the_clocks_came_apart(clock_ahead):
    (clock,) = _texts(clock_ahead, clock_ahead.first_divergence, "clock")
    assert "first by more than 1.0 ms at step 2" in clock


def test_clocks_part_at_the_first_step_that_ends_more_than_the_tolerance_apart(clock_ahead):
    assert clock_ahead.clocks_parted == 2


def test_a_request_that_arrived_later_is_not_blamed_on_the_clock(tmp_path):
    a = record(tmp_path / "a", [0.0, 0.0, 0.015])
    b = record(tmp_path / "b", [0.0, 0.0, 0.025])
    cmp = Comparison(a, b)
    assert cmp.first_divergence == 2 and cmp.clocks_parted is None
    assert _texts(cmp, 2) == ["r2 arrived later in B than in A: it reached B's scheduler at 0.0300 s, after B's "
                              "step 2 began (0.0200 s); A's at 0.0200 s, in time for A's (0.0200 s)"]


def test_where_each_scheduler_stopped_admitting_is_a_cause(fewer_seats):
    assert fewer_seats.first_divergence == 0
    assert _texts(fewer_seats, 0, "admission") == [
        "admissions stopped in A at r3: max_num_seqs reached: no free seat; in B at r2: max_num_seqs reached: "
        "no free seat"]


def test_a_different_running_set_carried_into_the_step_is_a_cause(fewer_seats):
    assert _texts(fewer_seats, 1, "running") == ["running when the step began: r2 in A only (3 in A, 2 in B)"]


def test_different_free_kv_blocks_carried_into_the_step_are_a_cause(fewer_seats):
    (kv,) = _texts(fewer_seats, 1, "kv")
    assert kv.startswith("free KV blocks when the step began: A 57, B 59")
    assert fewer_seats.pools_parted == 0


def test_the_compare_explanation_says_why_under_the_differences(clock_ahead):
    lines = clock_ahead.explain(4)
    assert lines[1].startswith("r2: scheduled in A only") and lines[2].startswith("why: r2 had not yet arrived in B")


def test_f_explains_and_c_and_k_jump_to_where_the_clocks_and_pools_parted(clock_ahead):
    async def go():
        app = StepscopeApp(clock_ahead.a, clock_ahead.b)
        seen = []
        async with app.run_test(size=(140, 40)) as pilot:
            for key in ("f", "c", "k"):
                await pilot.press(key)
                await pilot.pause()
                seen.append((app.pos, app.active_tab, str(app.query_one("#compare-explain").render())))
        return seen
    (f_pos, f_tab, f_text), (c_pos, c_tab, _), (k_pos, _, _) = asyncio.run(go())
    assert (f_pos, f_tab) == (4, "compare") and "B's clock ran 12.0 ms ahead" in f_text
    assert (c_pos, c_tab) == (2, "compare")
    assert k_pos == clock_ahead.pools_parted == 4


def test_the_full_sequence_reason_says_it_counts_prompt_and_output_so_far(tmp_path):
    run = record_waits(tmp_path / "sim")
    stop = reasons.admission_stop(run, run.pos_of_step(18))
    assert reasons.stop_text(stop) == ("sequence so far must fit: its 56 tokens (prompt 40 + 16 output) need "
                                       "7 blocks beyond cached ones, 5 free")


def test_the_request_view_wraps_a_long_reason_instead_of_cutting_it(tmp_path):
    run = record_waits(tmp_path / "sim")
    whole = ("steps 18-24: sequence so far must fit: its 56 tokens (prompt 40 + 16 output) need 7 blocks beyond "
             "cached ones, 5 free")

    async def go():
        async with StepscopeApp(run).run_test(size=(90, 40)) as pilot:
            for key in ("s", "r", "2", "enter", "3"):
                await pilot.press(key)
            await pilot.pause()
            table = pilot.app.query_one("#lifecycle", VTable)
            return [table.render_line(y).text for y in range(table.size.height)]
    lines = asyncio.run(go())
    assert not any("…" in line for line in lines)
    detail = " ".join(line[30:].strip() for line in lines)  # after the time, step and event columns
    assert whole in " ".join(detail.split())
