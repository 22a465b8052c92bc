"""`sim compare`: per-step decision match, the first divergence explained, metric errors, JSON output."""
import json
import shutil

import pandas as pd
import pytest

import traces
from engine.core import CacheConfig, SchedulerConfig
from sim.cost_models.base import CostModelInfo, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cli import main
from sim.fidelity.compare import compare_traces
from sim.core.simulator import Simulator
from sim.core.sources import open_source
from workloads import DEFAULT_WORKLOAD
from sim.cost_models.base import CostModelDefaults

BURSTY = str(DEFAULT_WORKLOAD)


class _Cost(CostModelDefaults):
    name = "test"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.003 + 3e-5 * batch.num_prefill_tokens + 2e-4 * batch.num_decode_seqs)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "a"
    src = open_source(BURSTY, 32000, 30)
    Simulator(SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=512),
              CacheConfig(block_size=16, num_gpu_blocks=250), _Cost(), path, {"workload": src.meta}).run(src.requests)
    return path


def _copy_with(tmp_path, trace_dir, table, edit):
    out = tmp_path / "b"
    shutil.copytree(trace_dir, out)
    df = pd.read_parquet(out / f"{table}.parquet")
    edit(df).to_parquet(out / f"{table}.parquet", index=False)
    return out


def test_trace_compared_with_itself_matches_at_every_step(trace_dir):
    t = traces.load(trace_dir)
    r = compare_traces(t, t)
    assert r["decision_match_rate"] == 1.0 and r["matched_steps"] == len(t.steps)
    assert r["first_divergent_step"] is None and r["divergence"] == []
    assert all(m["rel_error"] in (0.0, None) for m in r["metrics"].values())
    assert r["step_time_mape"] == 0.0


def _with_step_inserted(tmp_path, trace_dir, at: int = 5, slower: float = 1.0):
    """A copy of the trace that takes one extra step at `at` (a copy of A's step `at` with other tokens),
    every step `slower` times as long, model time included."""
    out = tmp_path / "b"
    shutil.copytree(trace_dir, out)
    d = pd.read_parquet(out / "decisions.parquet")
    extra = d[d["step"] == at].assign(num_tokens=99)
    d.loc[d["step"] >= at, "step"] += 1
    pd.concat([d, extra]).sort_values("step", kind="stable").to_parquet(out / "decisions.parquet", index=False)
    s = pd.read_parquet(out / "steps.parquet")
    s = pd.concat([s[s["step"] < at], s[s["step"] == at], s[s["step"] >= at].assign(step=lambda x: x["step"] + 1)])
    s["end"] = s["start"] + (s["end"] - s["start"]) * slower
    s["execute_time"] = s["execute_time"] * slower
    s.to_parquet(out / "steps.parquet", index=False)
    return out


def test_a_step_inserted_early_shifts_the_index_match_but_not_the_aligned_one(tmp_path, trace_dir):
    a = traces.load(trace_dir)
    r = compare_traces(a, traces.load(_with_step_inserted(tmp_path, trace_dir)))
    assert r["first_divergent_step"] == 5 and r["matched_steps"] < len(a.steps) // 2
    assert r["aligned_matched_steps"] == len(a.steps)


def test_error_breakdown_times_identical_steps_past_an_inserted_step_with_b_own_times(tmp_path, trace_dir):
    """Paired by index, only the five steps before the inserted one would lend B's (doubled) model times."""
    a = traces.load(trace_dir)
    r = compare_traces(a, traces.load(_with_step_inserted(tmp_path, trace_dir, slower=2.0)))
    att = r["attribution"]
    assert att["identical_steps"] == len(a.steps) and att["pairing"] == "aligned"
    tpot = att["metrics"]["tpot_p50_s"]
    assert tpot["step_time"] > 0.5 * tpot["a"]
    assert r["identical_step_time_mape"] == pytest.approx(1.0)


def test_planted_token_count_change_is_found_at_its_step_and_request(tmp_path, trace_dir):
    d = traces.load(trace_dir).decisions
    rows = d.index[(d["event"] == "schedule") & (d["phase"] == "prefill")]
    row = rows[len(rows) // 2]
    step, rid = int(d.at[row, "step"]), d.at[row, "request_id"]

    def edit(df):
        df.loc[row, "num_tokens"] -= 1
        return df

    r = compare_traces(traces.load(trace_dir), traces.load(_copy_with(tmp_path, trace_dir, "decisions", edit)))
    assert r["first_divergent_step"] == step
    assert r["decision_match_rate"] == pytest.approx(1 - 1 / r["steps_a"])
    (diff,) = r["divergence"]
    assert diff["request_id"] == rid and any(w.startswith("tokens:") for w in diff["differences"])


def test_missing_preemption_is_explained(tmp_path, trace_dir):
    d = traces.load(trace_dir).decisions
    pre = d.index[d["event"] == "preempt"]
    assert len(pre), "the fixture should preempt"
    step, rid = int(d.at[pre[0], "step"]), d.at[pre[0], "request_id"]
    b = _copy_with(tmp_path, trace_dir, "decisions", lambda df: df.drop(index=pre[0]).reset_index(drop=True))
    r = compare_traces(traces.load(trace_dir), traces.load(b))
    assert r["first_divergent_step"] == step
    assert any(x["request_id"] == rid and "preempted in A only" in x["differences"] for x in r["divergence"])


def test_row_order_within_a_step_does_not_count_as_divergence(tmp_path, trace_dir):
    b = _copy_with(tmp_path, trace_dir, "decisions",
                   lambda df: df.iloc[::-1].sort_values("step", kind="stable").reset_index(drop=True))
    assert compare_traces(traces.load(trace_dir), traces.load(b))["decision_match_rate"] == 1.0


def test_step_time_mape_and_metric_errors_follow_slower_steps(tmp_path, trace_dir):
    def slower(df):
        df["end"] = df["start"] + (df["end"] - df["start"]) * 1.1
        return df

    r = compare_traces(traces.load(trace_dir), traces.load(_copy_with(tmp_path, trace_dir, "steps", slower)))
    assert r["step_time_mape"] == pytest.approx(0.1, rel=1e-6)
    assert r["decision_match_rate"] == 1.0


def test_cli_json_report_is_machine_readable(tmp_path, trace_dir, capsys):
    assert main(["compare", str(trace_dir), str(trace_dir), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["decision_match_rate"] == 1.0 and r["first_divergent_step"] is None
    assert {"ttft_p99_s", "tpot_p50_s", "e2e_p90_s", "output_throughput_tok_s"} <= set(r["metrics"])


def test_cli_text_report_names_first_divergent_step(tmp_path, trace_dir, capsys):
    d = traces.load(trace_dir).decisions
    row = d.index[d["event"] == "schedule"][5]

    def edit(df):
        df.at[row, "phase"] = "decode" if df.at[row, "phase"] == "prefill" else "prefill"
        return df

    b = _copy_with(tmp_path, trace_dir, "decisions", edit)
    assert main(["compare", str(trace_dir), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"first divergent step: {int(d.at[row, 'step'])}" in out and "phase:" in out


def test_cli_compare_of_a_non_trace_is_one_line_exit_2(tmp_path, trace_dir, capsys):
    assert main(["compare", str(trace_dir), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err


def test_report_labels_each_value_with_its_unit():
    from sim.report.summary import metric_label

    assert metric_label("ttft_p50_s") == ("ttft p50", 1e3, "ms")
    assert metric_label("output_throughput_tok_s") == ("output throughput", 1.0, "tok/s")
    assert metric_label("request_throughput_req_s") == ("request throughput", 1.0, "req/s")
    assert metric_label("duration_s") == ("duration", 1.0, "s")


def test_compare_warns_when_the_runs_were_configured_differently_naming_the_fields():
    from traces.describe import config_differences

    a = {"config": {"scheduler": {"max_num_batched_tokens": 2048, "policy": "fcfs"},
                    "cache": {"block_size": 32, "num_gpu_blocks": 512, "num_gpu_blocks_override": 512}}}
    b = {"config": {"scheduler": {"max_num_batched_tokens": 8192, "policy": "fcfs"},
                    "cache": {"block_size": 16, "num_gpu_blocks": 512, "num_gpu_blocks_override": None}}}
    assert config_differences(a, b) == ["scheduler.max_num_batched_tokens 2048 vs 8192", "cache.block_size 32 vs 16"]
    assert config_differences(a, a) == []
