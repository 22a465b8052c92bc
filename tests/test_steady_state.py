"""The planner's max rate is what a deployment sustains in steady state, not the burst it absorbs; and
every place that judges an SLO or computes a latency uses the one definition in traces.metrics."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from sim.cli import main as sim_main
from sim.plan.config import PlanConfig
from sim.plan.search import PlanSpec, evaluate_config, offered, request_lifetime
from sim.plan.window import Window
from sim.report.summary import sim_summary
from traces.metrics import evaluate_slos, parse_slo, request_latencies
from tui.model import RunIndex

ROOT = Path(__file__).resolve().parent.parent
AZURE = str(ROOT / "workloads" / "azure_conv.yaml")


def test_two_replicas_sustain_at_most_twice_one_replica_behind_a_router_blind_to_prefixes():
    """A finite burst compressed to a rate rewarded capacity more than linearly (2.5x for two replicas)."""
    spec = PlanSpec(workload=AZURE, slo="ttft_p99=2s,tpot_p99=80ms", max_requests=500)
    configs = [PlanConfig(replicas=n, hardware="h100", router="least_outstanding") for n in (1, 2)]
    spec.lifetime_s = request_lifetime(spec, configs)
    one, two = (evaluate_config(spec, c).max_rate for c in configs)
    assert one > 0 and two <= 2 * one * (1 + 0.1), (one, two)


def test_the_offered_stream_loops_the_workload_with_fresh_tokens_and_keeps_its_rate():
    spec = PlanSpec(workload=str(ROOT / "workloads" / "bursty.yaml"), slo="ttft_p99=2s", max_requests=20, window=40)
    stream, window = offered(spec, None, 1.0)
    assert window.total == len(stream) == 60 and window.loops == 3
    first, copy = stream[0], stream[20]
    assert copy.request_id == f"{first.request_id}~1" and copy.num_prompt_tokens == first.num_prompt_tokens
    assert copy.prompt_token_ids != first.prompt_token_ids
    gaps = np.diff([r.arrival for r in stream])
    assert (gaps >= 0).all()


def test_the_window_outlasts_two_request_lifetimes_at_the_rate():
    window = Window.for_rate(base=100, rate=50.0, requests=100, lifetime_s=6.0)
    assert window.warmup == window.requests == window.tail == 600


def _requests(ttft: list[float], finished: list[bool]) -> pd.DataFrame:
    n = len(ttft)
    return pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)], "arrival": np.zeros(n),
        "first_scheduled": np.zeros(n), "first_token": np.array(ttft, dtype=float),
        "finish": np.array(ttft, dtype=float) + 1.0, "num_output_tokens": np.full(n, 11),
        "finish_reason": ["length" if f else "error" for f in finished]})


def test_an_unfinished_request_misses_every_slo():
    reqs = _requests([0.1] * 19 + [math.nan], [True] * 19 + [False])
    verdict = evaluate_slos(reqs, parse_slo("ttft_p99=1s"))
    assert not verdict.met and math.isinf(verdict.results[0].measured_s) and verdict.attainment == 0.95


def test_replay_summary_and_plan_give_one_verdict_on_one_run(tmp_path):
    """A replay whose refused requests would have missed: the replay's summary now says MISSED too."""
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\nseed: 1\nnum_requests: 40\narrival: {process: poisson, rate: 20}\n"
                        "prompt_tokens: {dist: uniform, min: 16, max: 900}\noutput_tokens: {dist: fixed, value: 8}\n")
    out = tmp_path / "t"
    assert sim_main(["replay", str(workload), "--max-model-len", "512", "--trace", str(out), "--no-progress",
                     "--model", "qwen3-0.6b", "--hardware", "h100", "--json"]) == 0
    trace = traces.load(out)
    slos = parse_slo("ttft_p90=1s")
    assert (trace.requests["finish_reason"] == "error").mean() > 0.1
    summary = sim_summary(trace, slos)
    verdict = evaluate_slos(trace.requests, slos)
    assert summary["slos"][0]["met"] is verdict.met is False


def test_the_tui_reads_a_request_s_latencies_by_the_one_definition(tmp_path):
    out = tmp_path / "t"
    assert sim_main(["replay", str(ROOT / "workloads" / "bursty.yaml"), "--max-requests", "5", "--trace", str(out),
                     "--no-progress", "--model", "qwen3-0.6b", "--hardware", "h100", "--json"]) == 0
    trace = traces.load(out)
    model = RunIndex(trace)
    expected = request_latencies(trace.requests).set_index("request_id")
    for rid, row in expected.iterrows():
        got = model.latencies(rid)
        for m in ("queue", "ttft", "tpot", "e2e"):
            assert got[m] == pytest.approx(row[m], nan_ok=True)


def test_the_window_stays_bounded_at_rates_far_past_any_deployment():
    window = Window.for_rate(base=100, rate=1e6, requests=400, lifetime_s=10.0)
    assert window.total <= 3 * 4000


def test_smooth_arrivals_scale_linearly_with_replicas_at_few_seats():
    spec = PlanSpec(workload=str(ROOT / "workloads" / "poisson.yaml"), slo="ttft_p99=2s,tpot_p99=80ms",
                    max_requests=200)
    configs = [PlanConfig(replicas=n, hardware="h100", max_num_seqs=64) for n in (1, 2)]
    spec.lifetime_s = request_lifetime(spec, configs)
    one, two = (evaluate_config(spec, c).max_rate for c in configs)
    assert one > 0 and two <= 2 * one * (1 + 0.1), (one, two)


def test_a_plan_table_explains_a_rate_more_than_linear_in_replicas():
    from sim.plan.search import ConfigResult
    from sim.plan.table import format_table, rank

    configs = [PlanConfig(replicas=n, hardware="h100") for n in (1, 2)]
    rows = rank([(configs[0], ConfigResult(max_rate=10.0)), (configs[1], ConfigResult(max_rate=25.0))], {})
    text = format_table(rows, ["replicas"], tol=0.05)
    assert "more than linear in replicas" in text and "2 replicas 1.25x" in text
    assert "more than linear" not in format_table(rank([(configs[0], ConfigResult(max_rate=10.0)),
                                                        (configs[1], ConfigResult(max_rate=20.5))], {}),
                                                  ["replicas"], tol=0.05)
