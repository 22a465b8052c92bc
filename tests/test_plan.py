"""Capacity planning: the rate search brackets the SLO boundary, sweeps give one table whichever backend
ran them, an interrupted sweep resumes, bad input is one line and exit 2."""
import dataclasses
import json

import pytest

from sim.plan import reuse as reuse_mod
from sim.cli import main
from sim.plan.config import PlanConfig
from sim.plan.search import (ConfigResult, PlanSpec, evaluate_config, offered, run_at_rate, search_max_rate,
                             slo_check)
from sim.plan.table import format_table, rank, recommend
from sim.plan.plots import pareto_front
from traces.metrics import parse_slo
from sim.plan.sweep import parse_price, parse_sweep
from workloads import DEFAULT_WORKLOAD

BURSTY = str(DEFAULT_WORKLOAD)
SLO = "ttft_p99=500ms,tpot_p99=10ms"
CONFIG = PlanConfig(replicas=1, router="least_outstanding", hardware="h100", model="llama-3.1-8b",
                    max_model_len=8192, block_size=16, max_num_seqs=32)
PLAN_ARGS = [BURSTY, "--slo", SLO, "--sweep", "replicas=1..2,max_num_seqs=16,32", "--max-requests", "40",
             "--rate-tol", "0.1", "--max-model-len", "8192", "--price", "h100=2.5/h", "--no-progress"]


def _table(capsys, argv: list[str]) -> str:
    assert main(["plan", *argv]) == 0
    return "\n".join(line for line in capsys.readouterr().out.splitlines() if not line.startswith("plots:"))


def test_rate_search_brackets_the_slo_boundary_within_the_tolerance():
    spec = PlanSpec(workload=BURSTY, slo=SLO, rate_tol=0.1, max_requests=60)
    result = evaluate_config(spec, CONFIG)
    rate, slos = result.max_rate, parse_slo(SLO)
    assert rate > 0 and not result.capped
    for r, verdict in ((rate, True), (rate * 1.1, False)):
        stream, window = offered(spec, CONFIG.max_model_len, r)
        assert slo_check(run_at_rate(spec, CONFIG, r), slos, window, stream, r, spec.min_served_ratio)["meets"] is verdict


def test_search_max_rate_stops_within_tolerance_of_a_threshold():
    tried = []

    def meets(rate: float) -> bool:
        tried.append(rate)
        return rate <= 37.0

    rate, capped = search_max_rate(meets, 1.0, 0.02)
    assert rate <= 37.0 < rate * 1.02 and not capped
    assert len(tried) < 15  # bracketing and bisection, not a grid
    assert search_max_rate(lambda r: False, 1.0, 0.1, max_doublings=3) == (0.0, False)
    assert search_max_rate(lambda r: True, 1.0, 0.1, max_doublings=3) == (8.0, True)


def test_sweep_syntax_takes_ranges_and_value_lists():
    assert parse_sweep("replicas=1..3,max_num_seqs=64,128,router=round_robin,enable_prefix_caching=off") == {
        "replicas": [1, 2, 3], "max_num_seqs": [64, 128], "router": ["round_robin"],
        "enable_prefix_caching": [False]}
    assert parse_price("h200=3.5/h,H100=2") == {"h200": 3.5, "h100": 2.0}


def test_async_scheduling_is_a_plan_axis_that_changes_the_result_and_leaves_old_keys_alone():
    spec = PlanSpec(workload=BURSTY, slo=SLO, rate_tol=0.1, max_requests=40)
    sync, on = (run_at_rate(spec, dataclasses.replace(CONFIG, async_scheduling=a), 20.0) for a in (False, True))
    assert not sync.equals(on)
    assert "async_scheduling" not in CONFIG.to_dict()
    assert dataclasses.replace(CONFIG, async_scheduling=True).scheduler_config().async_scheduling


def test_cost_per_million_output_tokens_counts_every_replica():
    rows = rank([(dataclasses.replace(CONFIG, replicas=2), ConfigResult(max_rate=1.0, mean_output_tokens=100.0, attainment=1.0))],
                {"h100": 3.6})
    # 2 GPUs x $3.6/h for 1 req/s x 100 tokens x 3600 s = 0.36 M tokens per hour.
    assert rows[0].usd_per_m_output_tokens == pytest.approx(20.0)


@pytest.mark.parametrize("extra, message", [
    (["--sweep", "replicas=a"], "--sweep: replicas takes integers"),
    (["--sweep", "replicas=1..2,colour=red"], "--sweep: unknown parameter 'colour'"),
    (["--slo", "ttft_p99=2q"], "--slo:"),
    (["--price", "h100"], "--price:"),
    (["--hardware", "h900"], "unknown hardware 'h900'"),
])
def test_bad_plan_input_is_one_line_and_exit_2(capsys, extra, message):
    assert main(["plan", BURSTY, "--slo", SLO, "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_workload_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arrival: {process: poisson, rate: -1}\nnum_requests: 5\n")
    assert main(["plan", str(bad), "--slo", SLO, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and err.count("\n") == 1


def test_local_processes_give_the_same_table_as_one_process(tmp_path, capsys):
    inline = _table(capsys, [*PLAN_ARGS, "--jobs", "1", "--plots", str(tmp_path)])
    parallel = _table(capsys, [*PLAN_ARGS, "--jobs", "2"])
    rows = [line for line in inline.splitlines() if line[:3].strip().isdigit()]
    assert inline == parallel and len(rows) == 4
    for name in ("latency_vs_rate.png", "cost_frontier.png", "pareto.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_ray_gives_the_same_table_as_local_processes(capsys):
    ray = pytest.importorskip("ray")
    local = _table(capsys, [*PLAN_ARGS, "--jobs", "2"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = _table(capsys, [*PLAN_ARGS, "--ray", "auto"])
    finally:
        ray.shutdown()
    assert on_ray == local


def test_each_configuration_s_answer_is_printed_as_it_lands(capsys):
    assert main(["plan", *[a for a in PLAN_ARGS if a != "--no-progress"], "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    landed = [line for line in err.splitlines() if ": max rate " in line]
    assert len(landed) == 4 and all(line.split(":")[0] in out for line in landed)


def test_resume_runs_only_the_missing_configurations(tmp_path, capsys, monkeypatch):
    full = tmp_path / "full.jsonl"
    expected = _table(capsys, [*PLAN_ARGS, "--jobs", "1", "--results", str(full)])
    lines = full.read_text().splitlines()
    assert len(lines) == 4
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # two done, one torn mid-write
    ran = []
    real = reuse_mod.evaluate_config
    monkeypatch.setattr(reuse_mod, "evaluate_config", lambda spec, config, *rest: ran.append(config) or real(spec, config, *rest))
    resumed = _table(capsys, [*PLAN_ARGS, "--jobs", "1", "--results", str(partial)])
    done_before = {json.loads(line)["key"] for line in lines[:2]}
    # The missing two are simulated, or one of them is proven to run as another (sim.plan.reuse).
    assert 1 <= len(ran) <= 2 and not {c.key for c in ran} & done_before
    assert resumed.split("\n")[:-1] == expected.split("\n")[:-1]  # the last line says where results came from


def _result(rate: float, user_tok_s: float = 50.0) -> ConfigResult:
    return ConfigResult(max_rate=rate, mean_output_tokens=100.0, attainment=1.0, user_tok_s=user_tok_s,
                        slo_measured={"ttft_p99<=500ms": 0.4}, points=[{"rate": rate}])


def test_recommendation_is_the_cheapest_configuration_meeting_the_offered_rate():
    rows = rank([(dataclasses.replace(CONFIG, replicas=1), _result(0.8)), (dataclasses.replace(CONFIG, replicas=2), _result(1.6)),
                 (dataclasses.replace(CONFIG, replicas=3), _result(2.4))], {"h100": 2.0})
    line = recommend(rows, offered_rate=1.0, swept=["replicas"])
    assert line.startswith("recommendation: replicas=2 ") and "$4.00/h" in line


def test_recommendation_without_prices_is_the_best_rate_per_replica():
    rows = rank([(dataclasses.replace(CONFIG, replicas=1), _result(0.5)), (dataclasses.replace(CONFIG, replicas=2), _result(1.8)),
                 (dataclasses.replace(CONFIG, replicas=4), _result(3.0))], {})
    assert recommend(rows, offered_rate=1.0, swept=["replicas"]).startswith("recommendation: replicas=2 ")


def test_recommendation_says_when_nothing_meets_the_offered_rate():
    rows = rank([(dataclasses.replace(CONFIG, replicas=1), _result(0.5))], {})
    assert "none meets every SLO at the offered 1.000 req/s" in recommend(rows, 1.0, ["replicas"])


def test_configurations_with_identical_results_are_marked():
    rows = rank([(dataclasses.replace(CONFIG, max_num_seqs=64), _result(1.0)), (dataclasses.replace(CONFIG, max_num_seqs=256), _result(1.0)),
                 (dataclasses.replace(CONFIG, max_num_seqs=16), _result(0.7))], {})
    table = format_table(rows, ["max_num_seqs"])
    assert [r.same_as for r in rows] == [None, 1, None]
    assert table.count("(same results as #1)") == 1


def test_table_says_how_rows_are_ranked_and_shows_cost_only_when_priced():
    unpriced = format_table(rank([(CONFIG, _result(1.0))], {}), ["replicas"])
    priced = format_table(rank([(CONFIG, _result(1.0))], {"h100": 2.0}), ["replicas"])
    assert "ranked by max rate per replica" in unpriced and "$/M" not in unpriced
    assert "ranked by $ per million output tokens" in priced and "$/M out tok" in priced
    assert "goodput" not in priced  # at the max rate it repeats the max rate


def test_pareto_front_keeps_only_undominated_points():
    points = [(10.0, 100.0), (20.0, 80.0), (15.0, 70.0), (30.0, 40.0), (5.0, 90.0)]
    assert pareto_front(points) == [0, 1, 3]


def test_a_results_file_from_an_older_version_still_resumes(tmp_path):
    from sim.plan.sweep import append_result, load_results

    path = tmp_path / "results.jsonl"
    old = {"max_rate": 2.5, "capped": False, "attainment": 1.0, "mean_output_tokens": 80.0, "points": [{"rate": 2.5}],
           "a_field_from_elsewhere": 1}
    path.write_text(json.dumps({"plan": "p", "key": CONFIG.key, "config": CONFIG.to_dict(), "result": old}) + "\n")
    (result,) = load_results(path, "p").values()
    assert (result.max_rate, result.mean_output_tokens, result.rejected, result.note) == (2.5, 80.0, {}, None)
    append_result(path, "p", CONFIG, result)
    assert list(load_results(path, "p").values()) == [result]
