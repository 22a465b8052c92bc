"""The TUI explains waits and preemptions, on a simulator trace whose queue is held back by the token
budget (step 0), by max_num_seqs (steps 2-16), by a preempting step (17, r2 preempted for r0) and by
full-sequence admission (steps 18-29: r2, preempted after 16 output tokens, needs 7 blocks for its 56
tokens so far; r3-r5 wait behind it)."""
from __future__ import annotations

import asyncio

import pytest

import traces
from engine.core import CacheConfig, SchedulerConfig
from sim.cost_models.base import CostModelInfo, StepTiming
from sim.core.simulator import Simulator
from sim.core.sources import SimRequest
from tui.app import StepscopeApp
from tui.loader import open_trace
from tui.model import RunIndex
from tui.reasons import explained_lifecycle
from tui.views import scheduled_rows, waiting_rows
from tui.widgets.vtable import VTable
from sim.cost_models.base import CostModelDefaults


class _FixedCost(CostModelDefaults):
    """Every step takes 10 ms."""

    name = "fixed-test"

    def step_time(self, batch, step: int) -> StepTiming:
        return StepTiming(0.01)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, meta={"step": 0.01})


def record_waits(path) -> RunIndex:
    """The simulator trace the module docstring tells."""
    shapes = [(0.0, 40, 30)] * 3 + [(0.02, 24, 12)] * 3  # (arrival, prompt tokens, max tokens)
    reqs = [SimRequest(request_id=f"r{i}", arrival=t, prompt_token_ids=list(range(1000 + 100 * i, 1000 + 100 * i + n)),
                       max_tokens=m, add_time=t) for i, (t, n, m) in enumerate(shapes)]
    Simulator(SchedulerConfig(max_model_len=128, max_num_seqs=3, max_num_batched_tokens=64),
              CacheConfig(block_size=8, num_gpu_blocks=22, enable_prefix_caching=False),
              _FixedCost(), path, {}).run(reqs)
    return RunIndex(open_trace(path))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return record_waits(tmp_path_factory.mktemp("reasons") / "sim")


FULL_SEQUENCE = ("sequence so far must fit: its 56 tokens (prompt 40 + 16 output) need 7 blocks beyond cached ones, "
                 "5 free")


def waiting_why(run: RunIndex, step: int) -> dict[str, str]:
    count, row, ids = waiting_rows(run, run.pos_of_step(step), None)
    return {rid: (lambda c: c[0] if isinstance(c, tuple) else c)(row(i)[3]) for i, rid in enumerate(ids)}


def test_spent_budget_is_why_the_third_request_waits_at_step_0(run):
    assert waiting_why(run, 0) == {"r2": "token budget spent"}


def test_full_seats_hold_back_every_waiting_request(run):
    assert set(waiting_why(run, 5).values()) == {"max_num_seqs reached: no free seat"}
    assert set(waiting_why(run, 5)) == {"r3", "r4", "r5"}


def test_a_preempted_request_says_whom_it_made_room_for(run):
    why = waiting_why(run, 17)
    assert why["r2"] == "preempted for r0 (needed 1 block, 0 free)"
    assert why["r3"] == "no admissions: the step preempted"


def test_the_preempt_row_of_the_step_names_the_request_served_and_the_shortfall(run):
    rows, _, ids = scheduled_rows(run, run.pos_of_step(17), None)
    preempt = rows[ids.index("r2")]
    assert preempt[1] == "PREEMPT" and preempt[3] == "for r0" and preempt[5] == "needed 1, 0 free"


def test_full_sequence_admission_blocks_the_front_and_the_rest_wait_behind_it(run):
    assert waiting_why(run, 18) == {"r2": FULL_SEQUENCE,
                                    "r3": "waits behind r2 (queue order)",
                                    "r4": "waits behind r2 (queue order)",
                                    "r5": "waits behind r2 (queue order)"}


def test_lifecycle_tells_each_stretch_of_waiting_with_its_reason(run):
    waited = [e.detail for e in explained_lifecycle(run, "r3") if e.kind == "waited"]
    assert waited[:3] == ["steps 2-16: max_num_seqs reached: no free seat",
                          "step 17: no admissions: the step preempted",
                          "steps 18-29: waits behind r2 (queue order)"]


def test_lifecycle_preempt_line_names_the_request_it_made_room_for(run):
    preempt = [e for e in explained_lifecycle(run, "r2") if e.kind == "preempt"]
    assert len(preempt) == 1 and preempt[0].step == 17
    assert preempt[0].detail.endswith("for r0: needed 1 block, 0 free")


def test_a_trace_from_before_the_reason_columns_shows_only_the_preempted_mark(run):
    old = traces.load(run.trace.path)
    old.steps = old.steps.drop(columns=["admission_blocked", "admission_blocked_request",
                                        "admission_needed", "admission_available"])
    old.decisions = old.decisions.drop(columns=["preempted_for", "blocks_needed", "blocks_free"])
    old_run = RunIndex(old)
    assert waiting_why(old_run, 18) == {"r2": "preempted", "r3": "", "r4": "", "r5": ""}
    assert not [e for e in explained_lifecycle(old_run, "r3") if e.kind == "waited"]


def test_step_tab_shows_the_reasons_in_words(run):
    async def go():
        async with StepscopeApp(run).run_test(size=(140, 40)) as pilot:
            for key in ["g", "1", "8", "enter"]:
                await pilot.press(key)
            await pilot.pause()
            table = pilot.app.query_one("#waiting", VTable)
            return [table.cell_texts(i)[3] for i in range(table.count)]
    assert asyncio.run(go())[:2] == [FULL_SEQUENCE,
                                     "waits behind r2 (queue order)"]
