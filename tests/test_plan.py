"""Capacity planning: the rate search brackets the SLO boundary, sweeps give one table whichever backend
ran them, an interrupted sweep resumes, bad input is one line and exit 2."""
import json

import pytest

from sim import plan as plan_mod
from sim.cli import main
from sim.plan import PlanSpec, evaluate_config, rank, run_at_rate, search_max_rate, slo_check
from sim.report import parse_slo
from sim.sweep import parse_price, parse_sweep
from workloads import DEFAULT_WORKLOAD

BURSTY = str(DEFAULT_WORKLOAD)
SLO = "ttft_p99=500ms,tpot_p99=10ms"
CONFIG = {"replicas": 1, "router": "least_outstanding", "hardware": "h100", "model": "llama-3.1-8b",
          "max_model_len": 8192, "block_size": 16, "max_num_seqs": 32}
PLAN_ARGS = [BURSTY, "--slo", SLO, "--sweep", "replicas=1..2,max_num_seqs=16,32", "--max-requests", "40",
             "--rate-tol", "0.1", "--max-model-len", "8192", "--price", "h100=2.5/h", "--no-progress"]


def _table(capsys, argv: list[str]) -> str:
    assert main(["plan", *argv]) == 0
    return "\n".join(line for line in capsys.readouterr().out.splitlines() if not line.startswith("plots:"))


def test_rate_search_brackets_the_slo_boundary_within_the_tolerance():
    spec = PlanSpec(BURSTY, SLO, rate_tol=0.1, max_requests=60)
    result = evaluate_config(spec, CONFIG)
    rate, slos = result["max_rate"], parse_slo(SLO)
    assert rate > 0 and not result["capped"]
    for r, verdict in ((rate, True), (rate * 1.1, False)):
        assert slo_check(run_at_rate(spec, CONFIG, r), slos, 60, r, spec.min_served_ratio)["meets"] is verdict


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


def test_cost_per_million_output_tokens_counts_every_replica():
    rows = rank([({**CONFIG, "replicas": 2}, {"max_rate": 1.0, "mean_output_tokens": 100.0, "attainment": 1.0})],
                {"h100": 3.6})
    # 2 GPUs x $3.6/h for 1 req/s x 100 tokens x 3600 s = 0.36 M tokens per hour.
    assert rows[0]["usd_per_m_output_tokens"] == pytest.approx(20.0)


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
    assert inline == parallel and inline.count("replicas=") == 4
    assert (tmp_path / "latency_vs_rate.png").stat().st_size > 0 and (tmp_path / "cost_frontier.png").is_file()


def test_ray_gives_the_same_table_as_local_processes(capsys):
    ray = pytest.importorskip("ray")
    local = _table(capsys, [*PLAN_ARGS, "--jobs", "2"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = _table(capsys, [*PLAN_ARGS, "--ray", "auto"])
    finally:
        ray.shutdown()
    assert on_ray == local


def test_resume_runs_only_the_missing_configurations(tmp_path, capsys, monkeypatch):
    full = tmp_path / "full.jsonl"
    expected = _table(capsys, [*PLAN_ARGS, "--jobs", "1", "--results", str(full)])
    lines = full.read_text().splitlines()
    assert len(lines) == 4
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # two done, one torn mid-write
    ran = []
    real = plan_mod.evaluate_config
    monkeypatch.setattr(plan_mod, "evaluate_config", lambda spec, config: ran.append(config) or real(spec, config))
    resumed = _table(capsys, [*PLAN_ARGS, "--jobs", "1", "--results", str(partial)])
    done_before = {json.loads(line)["key"] for line in lines[:2]}
    assert len(ran) == 2 and not {json.dumps(c, sort_keys=True) for c in ran} & done_before
    assert resumed.split("\n")[:-1] == expected.split("\n")[:-1]  # the last line says where results came from
