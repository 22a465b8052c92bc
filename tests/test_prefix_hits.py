"""One prefix-hit figure: the summary, the steps table and the request view count every admission's hits,
re-admissions after a preemption included."""
from __future__ import annotations

from pathlib import Path

import traces
from sim.cli import main as sim_main
from traces.summary import summarize
from tui.model import RunIndex

ROOT = Path(__file__).resolve().parent.parent


def _preempting_run(tmp_path: Path) -> traces.Trace:
    out, workload = tmp_path / "t", tmp_path / "w.yaml"
    workload.write_text("name: p\nseed: 2\nnum_requests: 60\narrival: {process: poisson, rate: 200}\n"
                        "prompt_tokens: {dist: fixed, value: 64}\noutput_tokens: {dist: fixed, value: 96}\n"
                        "prefix: {groups: 2, tokens: 48, fraction: 1.0}\n")
    assert sim_main(["replay", str(workload), "--num-gpu-blocks-override", "64", "--max-num-seqs", "16",
                     "--trace", str(out), "--no-progress",
                     "--model", "qwen3-0.6b", "--hardware", "h100", "--json"]) == 0
    return traces.load(out)


def test_the_summary_counts_the_hits_of_every_admission_as_the_steps_table_does(tmp_path):
    t = _preempting_run(tmp_path)
    hits, computed = t.steps["prefix_hit_tokens"].sum(), t.steps["num_prefill_tokens"].sum()
    assert t.requests["num_preemptions"].sum() > 0 and hits > t.requests["num_cached_tokens"].sum()
    assert summarize(t.requests, t.steps)["prefix_hit_rate"] == hits / (hits + computed)


def test_the_request_view_shows_a_request_s_hits_over_all_its_admissions(tmp_path):
    t = _preempting_run(tmp_path)
    run = RunIndex(t)
    per_request = t.decisions.groupby("request_id", observed=True)["prefix_hit_tokens"].sum()
    assert sum(run.prefix_hits(rid) for rid in t.requests["request_id"]) == t.steps["prefix_hit_tokens"].sum()
    rid = per_request.idxmax()
    assert run.prefix_hits(rid) == per_request[rid]
