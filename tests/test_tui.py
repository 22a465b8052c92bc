"""The TUI over small traces recorded from the real scheduler (fake model runner, deterministic clock):
derived queues, navigation keys, the block map, request lifecycles, the comparison of two runs, the
help screen, small terminals and the command line."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import traces
from core_helpers import fake_output, make_requests, make_scheduler
from traces.blocks import BlockPoolIndex
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from tui import cli
from tui.app import StepscopeApp
from tui.compare import Comparison
from tui.loader import REPEATED_STRINGS, UNSHOWN, open_trace
from tui.model import RunIndex
from tui.widgets.blockmap import MINE, BlockMap
from tui.widgets.timeline import LABEL, Timeline
from tui.widgets.vtable import VTable
from recording import record_step

SIZE = (120, 40)


def record(path, policy="fcfs", delay=None):
    """8 requests (4 sharing an 8-token prefix) arriving every 2 steps into a 10-block pool: prefix
    hits, a waiting queue and preemptions. `delay=(rid, steps)` plants a later arrival."""
    now = [0.0]
    sched = make_scheduler(num_blocks=10, block_size=4, max_model_len=48, max_num_seqs=3, policy=policy)
    sched.clock = lambda: now[0]
    meta = {"source": "sim", "config": {"model": {"architecture": "Fixture"},
                                        "scheduler": {"policy": policy, "max_num_seqs": 3}},
            "device": {"type": "cpu"}, "workload": {"name": "fixture"}, "cost_model": {"name": "fixed"}}
    rec = TraceRecorder(TraceWriter(path, meta), sched, snapshot_every=8)
    prio = [1, 0, 1, 0] if policy == "priority" else None
    reqs = (make_requests(4, num_tokens=14, max_tokens=10, ignore_eos=True, prefix=list(range(500, 508)),
                          arrival_times=[0.02 * i for i in range(4)], priorities=prio)
            + make_requests(4, num_tokens=6, max_tokens=7, ignore_eos=True, start=4,
                            arrival_times=[0.02 * i for i in range(4, 8)]))
    arrive = {r.request_id: 2 * i for i, r in enumerate(reqs)}
    if delay:
        arrive[delay[0]] += delay[1]
    step = 0
    while sched.has_unfinished_requests() or any(a >= step for a in arrive.values()):
        now[0] = step * 0.01
        for r in reqs:
            if arrive[r.request_id] == step:
                sched.add_request(r)
                rec.on_add(r)
        out = sched.schedule()
        now[0] = step * 0.01 + 0.008
        outputs = sched.update_from_output(out, fake_output(out, sched))
        record_step(rec, out, outputs, step * 0.01, step * 0.01 + 0.008, 0.001, 0.006, 0.001)
        step += 1
    rec.close()
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tui")
    return {"a": record(root / "run_a"), "b": record(root / "run_b", delay=("r1", 1)),
            "prio": record(root / "run_prio", policy="priority")}


@pytest.fixture(scope="module")
def run_a(dirs):
    return RunIndex(open_trace(dirs["a"]))


def drive(app, keys, size=SIZE, check=None):
    """Run `app` headless, press `keys`, then call `check(app)` inside the running app."""
    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for k in keys:
                await pilot.press(k)
            await pilot.pause()
            return check(app) if check else None
    return asyncio.run(go())


def table_column(app, table_id, col=0):
    t = app.query_one(f"#{table_id}", VTable)
    return [t.cell_texts(i)[col] for i in range(t.count)]


def static_text(app, wid):
    return str(app.query_one(f"#{wid}").render())


# ---- derived queues ----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["a", "prio"])
def test_derived_queue_lengths_match_the_recorded_counts_at_every_step(dirs, which):
    run = RunIndex(open_trace(dirs[which]))
    assert run.preempt_pos.size > 0
    for i in range(run.n):
        running, waiting = run.queues.queues_at(int(run.step_no[i]), run.start[i])
        assert (len(running), len(waiting)) == (run.num_running[i], run.num_waiting[i]), f"step {i}"


def test_fcfs_waiting_queue_puts_the_latest_preempted_request_first(run_a):
    q = run_a.queues
    checked = 0
    for pos in run_a.preempt_pos:
        victims = run_a.decisions_at(pos).query("event == 'preempt'")["request_id"].tolist()
        codes, pre = q.waiting_detail(int(run_a.step_no[pos]), run_a.start[pos])
        assert q.ids[codes[0]] == victims[-1] and pre[0]
        checked += 1
    assert checked >= 2


def test_fcfs_victims_are_the_last_of_the_derived_running_queue(run_a):
    for pos in run_a.preempt_pos:
        victims = run_a.decisions_at(pos).query("event == 'preempt'")["request_id"].tolist()
        running, _ = run_a.queues.queues_at(int(run_a.step_no[pos]) - 1, run_a.start[pos - 1])
        assert victims == running[::-1][:len(victims)], f"step {pos}"


def test_priority_waiting_queue_is_in_priority_then_arrival_order(dirs):
    run = RunIndex(open_trace(dirs["prio"]))
    req = run.requests.set_index("request_id")
    seen_two = False
    for i in range(run.n):
        _, waiting = run.queues.queues_at(int(run.step_no[i]), run.start[i])
        keys = [(req.loc[r, "priority"], req.loc[r, "arrival"], r) for r in waiting]
        assert keys == sorted(keys)
        seen_two |= len(waiting) >= 2
    assert seen_two


# ---- the step view and navigation --------------------------------------------------------------
def test_step_view_lists_the_scheduled_requests_and_the_preempted_one(run_a):
    pos = int(run_a.preempt_pos[0])
    dec = run_a.decisions_at(pos)

    def check(app):
        assert app.pos == pos
        rows = [app.query_one("#scheduled", VTable).cell_texts(i) for i in range(len(dec))]
        assert [r[0] for r in rows] == list(dec.sort_values("event", key=lambda e: e != "schedule",
                                                            kind="stable")["request_id"])
        victim = dec.query("event == 'preempt'")["request_id"].iloc[0]
        assert [victim, "PREEMPT"] == [r for r in rows if r[1] == "PREEMPT"][0][:2]
        assert f"preempted: {victim}" in static_text(app, "step-summary")
        assert f"Step {run_a.step_no[pos]} " in static_text(app, "step-summary")
        assert table_column(app, "waiting", 1)[0] == victim
    drive(StepscopeApp(run_a), ["x"], check=check)


def test_step_keys_move_by_one_and_by_a_hundred_and_clamp(run_a):
    seen = []

    def check(app):
        seen.append(app.pos)
    drive(StepscopeApp(run_a), ["n", "n", "p"], check=check)
    drive(StepscopeApp(run_a), ["right_square_bracket"], check=check)
    drive(StepscopeApp(run_a), ["right_square_bracket", "left_square_bracket", "p"], check=check)
    assert seen == [1, run_a.n - 1, 0]


def test_goto_prompt_jumps_to_the_step_typed(run_a):
    def check(app):
        assert app.pos == 7
        assert "step 7 (8/" in static_text(app, "title")
    drive(StepscopeApp(run_a), ["g", "7", "enter"], check=check)


def test_x_walks_the_preemptions_forward_and_back(run_a):
    stops = []

    def check(app):
        stops.append(app.pos)
    keys = ["x"] * 2
    drive(StepscopeApp(run_a), keys, check=check)
    drive(StepscopeApp(run_a), keys + ["X"], check=check)
    assert stops == [int(run_a.preempt_pos[1]), int(run_a.preempt_pos[0])]


def test_r_jumps_to_each_step_where_the_selected_request_is_scheduled(run_a):
    dec = run_a.decisions
    expected = sorted(set(dec[(dec.request_id == "r2") & (dec.event == "schedule")]["step"]))
    visits = []

    def check(app):
        visits.append(app.pos)
    for k in range(1, 4):
        drive(StepscopeApp(run_a), ["s", "r", "2", "enter"] + ["r"] * k, check=check)
    assert visits == expected[:3]


def test_timeline_cursor_sits_on_the_step_and_shows_its_values(run_a):
    pos = int(run_a.preempt_pos[0])

    def check(app):
        lines = app.query_one(Timeline).render().plain.splitlines()
        assert lines[-1].index("▲") == LABEL + pos
        assert f"{run_a.tokens[pos]} tok" in lines[1] and f"{run_a.kv_frac[pos] * 100:.1f}%" in lines[2]
    drive(StepscopeApp(run_a), ["x"], check=check)


# ---- block map ---------------------------------------------------------------------------------
def test_block_map_colours_the_pool_and_highlights_the_selected_requests_blocks(run_a):
    pos = 6
    index = BlockPoolIndex.from_trace(run_a.trace)
    held_by_r1 = sum("r1" in b.holders for b in index.state_at(pos))

    def check(app):
        codes = app.query_one(BlockMap).codes
        base = codes & ~MINE
        assert int((base >= 2).sum()) == run_a.kv_used[pos]
        assert int(((codes & MINE) > 0).sum()) == held_by_r1 > 0
        assert f"held {int((base == 2).sum())}" in static_text(app, "block-legend")
    drive(StepscopeApp(run_a), ["g", "6", "enter", "s", "r", "1", "enter", "2"], check=check)


def test_selecting_a_shared_block_tells_its_ref_count_hash_and_holders(run_a):
    pos = 6
    blocks = BlockPoolIndex.from_trace(run_a.trace).state_at(pos)
    shared = next(b for b in blocks if len(b.holders) > 1)
    moves = ["right"] * (shared.block_id - 1)

    def check(app):
        text = static_text(app, "block-detail")
        assert f"block {shared.block_id} " in text and f"ref_cnt {len(shared.holders)}" in text
        assert shared.hash in text and ", ".join(shared.holders) in text
    drive(StepscopeApp(run_a), ["g", "6", "enter", "2"] + moves, check=check)


# ---- request lifecycle -------------------------------------------------------------------------
def test_request_tab_tells_the_life_of_a_preempted_request(run_a):
    victim = run_a.decisions.query("event == 'preempt'")["request_id"].iloc[0]
    n_pre = int((run_a.decisions.query("event == 'preempt'")["request_id"] == victim).sum())

    def check(app):
        kinds = table_column(app, "lifecycle", 2)
        assert kinds[0] == "arrival" and kinds[-1] == "finished"
        assert kinds.count("preempt") == n_pre and kinds.count("prefill") >= n_pre + 1
        assert "first token" in kinds and "finish" in kinds
        assert "TTFT" in static_text(app, "request-info") and victim in static_text(app, "request-info")
    drive(StepscopeApp(run_a), ["s", *victim, "enter", "3"], check=check)


# ---- comparing two runs ------------------------------------------------------------------------
def test_compare_finds_the_first_divergence_planted_in_a_pair_of_traces(dirs, run_a):
    run_b = RunIndex(open_trace(dirs["b"]), "B")
    cmp = Comparison(run_a, run_b)
    assert cmp.first_divergence == 2
    why = "\n".join(cmp.explain(2))
    assert "r1: scheduled in A only" in why and "r1 arrived later in B than in A: it reached B's scheduler at 0.0300 s" in why
    assert "same decisions" in cmp.explain(1)[0]


def test_f_jumps_to_the_first_divergence_and_explains_it(dirs, run_a):
    def check(app):
        assert app.pos == 2 and app.active_tab == "compare"
        assert "r1: scheduled in A only" in static_text(app, "compare-explain")
        assert app.query_one("#compare-table", VTable).cursor == 2
    drive(StepscopeApp(run_a, RunIndex(open_trace(dirs["b"]), "B")), ["f"], check=check)


def test_a_run_compared_with_itself_never_diverges(dirs, run_a):
    assert Comparison(run_a, RunIndex(open_trace(dirs["a"]), "B")).first_divergence is None


def test_b_shows_the_other_run(dirs, run_a):
    def check(app):
        title = static_text(app, "title")
        assert app.current.label == "B" and "B: sim · " in title and "run_b" in title
    drive(StepscopeApp(run_a, RunIndex(open_trace(dirs["b"]), "B")), ["b"], check=check)


# ---- help, small terminals, command line -------------------------------------------------------
def test_help_screen_lists_every_binding(run_a):
    def check(app):
        text = str(app.screen.query_one("#help-text").render())
        missing = [b.description for b in StepscopeApp.BINDINGS if b.description not in text]
        assert not missing
    drive(StepscopeApp(run_a), ["question_mark"], check=check)


def test_help_screen_keeps_keys_and_descriptions_apart_and_names_no_source_file(run_a):
    def check(app):
        text = str(app.screen.query_one("#help-text").render())
        assert ".py" not in text
        for line in text.splitlines():
            if line.startswith("  ") and line.strip():
                assert "   " in line.strip(), f"key and description run together: {line!r}"
    drive(StepscopeApp(run_a), ["question_mark"], check=check)


def test_small_terminal_gets_a_message_and_the_layout_comes_back_when_it_grows(run_a):
    async def go():
        app = StepscopeApp(run_a)
        async with app.run_test(size=(50, 12)) as pilot:
            await pilot.pause()
            assert app.screen.has_class("-tiny") and "too small" in static_text(app, "too-small")
            assert app.query_one("#tabs").region.area == 0
            await pilot.resize_terminal(*SIZE)
            await pilot.pause()
            assert not app.screen.has_class("-tiny") and app.query_one("#scheduled").region.area > 0
    asyncio.run(go())


def test_not_a_trace_exits_2_with_one_line(tmp_path, capsys):
    assert cli.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path) in err
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 99}))
    assert cli.main([str(tmp_path)]) == 2
    assert "format_version" in capsys.readouterr().err


def test_fast_loader_reads_the_same_tables_as_traces_load_less_the_unshown_columns(dirs):
    fast, slow = open_trace(dirs["a"]), traces.load(dirs["a"])
    for name in ("steps", "requests", "decisions", "block_events", "block_snapshots"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert list(a.columns) == [c for c in b.columns if c not in UNSHOWN.get(name, ())] and len(a) == len(b)
    assert [list(x) for x in fast.decisions["blocks_gained"]] == [list(x) for x in slow.decisions["blocks_gained"]]
    for c in REPEATED_STRINGS:
        if c in slow.decisions:
            assert fast.decisions[c].astype(object).tolist() == slow.decisions[c].tolist()


def test_bench_trace_is_a_consistent_trace(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("tui_speed", Path(__file__).parents[1] / "bench" / "tui_speed.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tui_speed", bench)
    spec.loader.exec_module(bench)
    bench.write_big_trace(tmp_path, num_steps=3000, concurrency=4, num_blocks=512)
    run = RunIndex(open_trace(tmp_path))
    for i in range(0, run.n, 97):
        running, waiting = run.queues.queues_at(i, run.start[i])
        assert (len(running), len(waiting)) == (run.num_running[i], run.num_waiting[i])
        assert int((run.blocks_at(i).ref_counts() > 0).sum()) == run.kv_used[i]


# ---- snapshots (pytest-textual-snapshot) -------------------------------------------------------
@pytest.mark.parametrize("keys", [["x"], ["x", "2"], ["s", "r", "1", "enter", "3"], ["f"]],
                         ids=["step", "blocks", "request", "compare"])
def test_snapshot_of_main_screens(request, dirs, keys):
    pytest.importorskip("pytest_textual_snapshot")
    snap_compare = request.getfixturevalue("snap_compare")
    app = StepscopeApp(RunIndex(open_trace(dirs["a"])), RunIndex(open_trace(dirs["b"]), "B"))
    assert snap_compare(app, press=keys, terminal_size=SIZE)

