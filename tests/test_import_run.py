"""`sim import-run`: measured vLLM runs (LLMServingSim run bundles, `vllm bench serve` results) as trace
directories that `sim replay` and `sim compare` take; and the request metrics compare reports."""
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

import traces
from sim.cli import main
from sim.report.summary import request_metrics

# Shaped as LLMServingSim's files: the workload's rows, vLLM's per-request stamps (monotonic clock) and meta.
WORKLOAD = [
    {"input_toks": 4, "output_toks": 3, "arrival_time_ns": 46926808, "input_tok_ids": [5971, 2927, 220, 1032]},
    {"input_toks": 2, "output_toks": 5, "arrival_time_ns": 347938951, "input_tok_ids": [13191, 499]},
    {"input_toks": 3, "output_toks": 1, "arrival_time_ns": 479613520, "input_tok_ids": [5971, 2927, 88]},
    {"input_toks": 5, "output_toks": 2, "arrival_time_ns": 600000000, "input_tok_ids": [1, 2, 3, 4, 5]},
]
REQUESTS = [
    {"request_id": "bench-0", "input_toks": 4, "output_toks": 3, "arrival_time": 1777142838.338653,
     "queued_ts": 479748.5, "scheduled_ts": 479748.5, "first_token_ts": 479748.75, "last_token_ts": 479749.0},
    {"request_id": "bench-1", "input_toks": 2, "output_toks": 5, "arrival_time": 1777142838.6237123,
     "queued_ts": 479748.25, "scheduled_ts": 479748.5, "first_token_ts": 479749.0, "last_token_ts": 479750.25},
    {"request_id": "bench-2", "input_toks": 3, "output_toks": 1, "arrival_time": 1777142838.7561288,
     "queued_ts": 479749.0, "scheduled_ts": 479749.25, "first_token_ts": 479749.5, "last_token_ts": 479749.5},
    {"request_id": "bench-3", "input_toks": 5, "output_toks": 2, "arrival_time": 1777142838.9,
     "queued_ts": 479749.25, "scheduled_ts": 479749.25, "first_token_ts": 479749.5, "last_token_ts": 479750.0},
]
ENGINE_KWARGS = {"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "data_parallel_size": 1,
                 "enable_expert_parallel": False, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                 "max_model_len": None, "dtype": "bfloat16", "kv_cache_dtype": "auto", "seed": 42}


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def make_run(root: Path, requests: list[dict] = REQUESTS, workload: list[dict] = WORKLOAD, **meta_over) -> Path:
    """A run bundle laid out as LLMServingSim's: workloads/ beside the run directory."""
    (root / "workloads").mkdir(parents=True, exist_ok=True)
    wl = root / "workloads" / "sharegpt-tiny.jsonl"
    wl.write_text(_lines(workload))
    run = root / "RTXPRO6000-Llama-3.1-8B"
    (run / "vllm").mkdir(parents=True, exist_ok=True)
    meta = {"schema_version": 1, "model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0",
            "engine_kwargs": ENGINE_KWARGS, "dataset_path": "workloads/sharegpt-tiny.jsonl",
            "dataset_hash": hashlib.sha256(wl.read_bytes()).hexdigest(), "num_requests": len(requests),
            "started_at": "2026-04-25T18:47:18.273385Z", **meta_over}
    (run / "vllm" / "meta.json").write_text(json.dumps(meta))
    (run / "vllm" / "requests.jsonl").write_text(_lines(requests))
    return run


def import_run(run: Path, out: Path, *extra: str) -> int:
    return main(["import-run", str(run), "-o", str(out), *extra])


@pytest.fixture
def imported(tmp_path):
    assert import_run(make_run(tmp_path), tmp_path / "trace") == 0
    return traces.load(tmp_path / "trace")


def test_times_are_vllm_stamps_minus_the_earliest_queued(imported):
    r = imported.requests.set_index("request_id")
    assert r.loc["bench-1", ["arrival", "queued", "first_scheduled", "first_token", "finish"]].tolist() == [
        0.0, 0.0, 0.25, 0.75, 2.0]
    assert r.loc["bench-0", ["arrival", "queued", "first_scheduled", "first_token", "finish"]].tolist() == [
        0.25, 0.25, 0.25, 0.5, 0.75]


def test_requests_carry_the_workload_prompt_ids_and_the_run_s_lengths(imported):
    r = imported.requests.set_index("request_id")
    assert [list(r.loc[f"bench-{i}", "prompt_token_ids"]) for i in range(4)] == [w["input_tok_ids"] for w in WORKLOAD]
    assert r["num_prompt_tokens"].tolist() == [4, 2, 3, 5]
    assert r["num_output_tokens"].tolist() == r["max_tokens"].tolist() == [3, 5, 1, 2]
    assert set(r["finish_reason"]) == {"length"} and all(len(ids) == 0 for ids in r["output_token_ids"])


def test_trace_is_a_vllm_run_with_requests_and_no_steps(imported):
    assert imported.meta["source"] == "vllm" and imported.meta["format_version"] == 1
    assert imported.meta["vllm"]["version"] == "0.19.0" and imported.meta["complete"] is True
    assert len(imported.requests) == 4 and len(imported.steps) == 0 and len(imported.decisions) == 0


def test_config_is_the_recorded_engine_kwargs(imported):
    config = imported.meta["config"]
    assert config["model"]["model"] == "meta-llama/Llama-3.1-8B" and config["model"]["seed"] == 42
    assert config["scheduler"]["max_num_seqs"] == 8 and config["scheduler"]["max_num_batched_tokens"] == 64
    assert "scheduler.max_num_seqs" in imported.meta["import"]["recorded"]


def test_config_fills_the_rest_with_vllm_0_19_defaults_and_says_so(imported):
    scheduler, cache = imported.meta["config"]["scheduler"], imported.meta["config"]["cache"]
    assert scheduler["async_scheduling"] is True and scheduler["scheduler_reserve_full_isl"] is True
    assert scheduler["enable_chunked_prefill"] is True and scheduler["policy"] == "fcfs"
    assert cache["block_size"] == 16 and cache["enable_prefix_caching"] is True
    inferred = imported.meta["import"]["inferred"]
    assert inferred["scheduler.async_scheduling"].startswith("vLLM 0.19.0 default: vllm/config/")
    assert "cache.block_size" in inferred and "scheduler.max_num_seqs" not in inferred


def test_kv_block_count_is_left_to_the_replay_when_the_run_did_not_record_it(imported):
    assert "num_gpu_blocks" not in imported.meta["config"]["cache"]
    assert "cache.num_gpu_blocks" in imported.meta["import"]["unknown"]


def test_model_config_becomes_hf_config_and_sets_max_model_len(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "max_position_embeddings": 131072, "vocab_size": 128256}))
    assert import_run(make_run(tmp_path), tmp_path / "t", "--model-config", str(tmp_path / "config.json")) == 0
    model = traces.load(tmp_path / "t").meta["config"]["model"]
    assert model["hf_config"]["vocab_size"] == 128256 and model["architecture"] == "LlamaForCausalLM"
    assert traces.load(tmp_path / "t").meta["config"]["scheduler"]["max_model_len"] == 131072


def test_workload_given_with_a_flag_replaces_dataset_path(tmp_path):
    run = make_run(tmp_path, dataset_path="elsewhere.jsonl")
    assert import_run(run, tmp_path / "t", "--workload", str(tmp_path / "workloads" / "sharegpt-tiny.jsonl")) == 0
    assert len(traces.load(tmp_path / "t").requests) == 4


def test_missing_dataset_path_without_workload_flag_is_one_line(tmp_path, capsys):
    run = make_run(tmp_path, dataset_path="elsewhere.jsonl")
    assert import_run(run, tmp_path / "t") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "meta.json: dataset_path: 'elsewhere.jsonl' is not under" in err
    assert "--workload" in err


def test_workload_that_is_not_the_dataset_the_run_hashed_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, dataset_hash="0" * 64), tmp_path / "t") == 2
    assert "sha256 differs from the run's dataset_hash" in capsys.readouterr().err


def _with(row: int, **change) -> list[dict]:
    rows = [dict(r) for r in REQUESTS]
    rows[row].update(change)
    return [{k: v for k, v in r.items() if v is not _DROP} for r in rows]


_DROP = object()
BAD_REQUESTS = {
    "missing field": (_with(1, first_token_ts=_DROP), "line 2: missing field 'first_token_ts'"),
    "wrong type": (_with(2, scheduled_ts="soon"), "line 3: scheduled_ts 'soon' is not a number"),
    "non-finite time": (_with(0, last_token_ts=float("nan")), "line 1: last_token_ts nan is not a finite number"),
    "negative time": (_with(3, queued_ts=-1.0), "line 4: queued_ts -1.0 is negative"),
    "times out of order": (_with(0, first_token_ts=479748.0), "line 1: first_token_ts 479748.0 is before scheduled_ts"),
    "duplicate id": (_with(3, request_id="bench-1"), "line 4: request_id 'bench-1' repeats line 2"),
    "token count": (_with(2, input_toks=30), "line 3: input_toks: bench-2 has 30 prompt tokens, but row 2 of"),
    "count not an integer": (_with(1, output_toks=2.5), "line 2: output_toks 2.5 is not a token count"),
    "no workload row": (_with(3, request_id="bench-9"), "line 4: input_toks: bench-9: the workload"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_requests_file_is_one_line_naming_file_row_and_field(tmp_path, capsys, case):
    rows, message = BAD_REQUESTS[case]
    assert import_run(make_run(tmp_path, requests=rows), tmp_path / "t") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "requests.jsonl: " + message in err


def test_unparseable_requests_line_is_one_line_naming_it(tmp_path, capsys):
    run = make_run(tmp_path)
    text = (run / "vllm" / "requests.jsonl").read_text()
    (run / "vllm" / "requests.jsonl").write_text(text[:-40])  # the last line cut mid-write
    assert import_run(run, tmp_path / "t") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "requests.jsonl: line 4: not valid JSON" in err


def test_bad_engine_argument_names_meta_json_and_the_argument(tmp_path, capsys):
    run = make_run(tmp_path, engine_kwargs={**ENGINE_KWARGS, "max_num_seqs": 0})
    assert import_run(run, tmp_path / "t") == 2
    assert "meta.json: engine_kwargs.max_num_seqs: must be an int in [1, " in capsys.readouterr().err


def test_a_directory_of_other_files_takes_the_trace_beside_them_and_keeps_them(tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert import_run(make_run(tmp_path), out) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert len(traces.load(out).requests) == len(REQUESTS)


def test_a_directory_holding_a_trace_is_refused_without_overwrite(tmp_path, capsys):
    run = make_run(tmp_path)
    assert import_run(run, tmp_path / "t") == 0
    capsys.readouterr()
    assert import_run(run, tmp_path / "t") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --overwrite" in err


def test_overwrite_replaces_the_trace_in_an_existing_directory(tmp_path):
    run = make_run(tmp_path)
    assert import_run(run, tmp_path / "t") == 0
    make_run(tmp_path, requests=REQUESTS[:2])
    assert import_run(run, tmp_path / "t", "--overwrite") == 0
    assert len(traces.load(tmp_path / "t").requests) == 2


# `vllm bench serve --save-result --save-detailed`: one JSON object, per-request lists in request order.
BENCH = {"date": "20260425-184718", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B", "num_prompts": 3,
         "request_rate": 10.0, "burstiness": 1.0, "max_concurrency": None, "duration": 3.5,
         "input_lens": [4, 2, 3], "output_lens": [3, 4, 0], "ttfts": [0.25, 0.5, 0.0],
         "itls": [[0.125, 0.125], [0.25, 0.25, 0.25, 0.25], []], "start_times": [1000.5, 1000.25, 1001.0],
         "generated_texts": ["a", "b", ""], "errors": ["", "", "Bad Gateway"]}


def import_bench(tmp_path: Path, result: dict, *extra: str) -> int:
    (tmp_path / "result.json").write_text(json.dumps(result))
    (tmp_path / "wl.jsonl").write_text(_lines(WORKLOAD[:3]))
    return main(["import-run", str(tmp_path / "result.json"), "--workload", str(tmp_path / "wl.jsonl"),
                 "-o", str(tmp_path / "t"), *extra])


def test_bench_result_times_are_start_times_plus_ttft_and_itls(tmp_path):
    assert import_bench(tmp_path, BENCH) == 0
    r = traces.load(tmp_path / "t").requests.set_index("request_id")
    assert r.loc["bench-0", ["arrival", "first_token", "finish"]].tolist() == [0.25, 0.5, 0.75]
    assert r.loc["bench-1", ["arrival", "first_token", "finish"]].tolist() == [0.0, 0.5, 1.5]
    assert list(r.loc["bench-1", "prompt_token_ids"]) == WORKLOAD[1]["input_tok_ids"]


def test_bench_result_failed_request_is_an_error_row(tmp_path):
    assert import_bench(tmp_path, BENCH) == 0
    row = traces.load(tmp_path / "t").requests.set_index("request_id").loc["bench-2"]
    assert row["finish_reason"] == "error" and row["error"] == "Bad Gateway" and pd.isna(row["first_token"])
    assert row["num_output_tokens"] == 0


def test_bench_result_output_length_is_what_came_back_and_max_tokens_what_the_workload_asked(tmp_path):
    assert import_bench(tmp_path, BENCH) == 0
    r = traces.load(tmp_path / "t").requests.set_index("request_id")
    assert r.loc["bench-1", ["num_output_tokens", "max_tokens"]].tolist() == [4, 5]


def test_bench_result_without_start_times_takes_the_workload_arrivals_and_says_so(tmp_path):
    assert import_bench(tmp_path, {k: v for k, v in BENCH.items() if k != "start_times"}) == 0
    t = traces.load(tmp_path / "t")
    r = t.requests.set_index("request_id")
    assert r.loc["bench-1", ["arrival", "first_token"]].tolist() == pytest.approx([0.347938951, 0.847938951])
    assert "requests.arrival" in t.meta["import"]["inferred"]


def test_bench_result_list_of_another_length_names_the_field(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "ttfts": [0.25, 0.5]}) == 2
    assert "result.json: ttfts: 2 entries, input_lens has 3" in capsys.readouterr().err


def test_bench_result_input_length_other_than_the_workload_names_the_entry(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "input_lens": [4, 7, 3]}) == 2
    assert "result.json: input_lens[1]: bench-1 has 7 prompt tokens, but row 1 of the workload" in \
        capsys.readouterr().err


def test_bench_result_negative_itl_names_the_entry(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "itls": [[0.125, -0.5], [], []]}) == 2
    assert "result.json: itls[0][1]: inter-token latency -0.5 is negative" in capsys.readouterr().err


def test_replay_of_an_imported_trace_runs_its_recorded_configuration(tmp_path):
    assert import_run(make_run(tmp_path), tmp_path / "imported") == 0
    assert main(["replay", str(tmp_path / "imported"), "--cost-model", "roofline", "--model", "llama-3.1-8b",
                 "--hardware", "h100", "--no-progress", "--json", "--trace", str(tmp_path / "replay")]) == 0
    replay = traces.load(tmp_path / "replay")
    assert replay.meta["config"]["scheduler"]["max_num_seqs"] == 8
    assert replay.meta["config"]["scheduler"]["async_scheduling"] is True
    assert set(replay.requests["finish_reason"]) == {"length"} and len(replay.requests) == 4


def test_replay_flag_overrides_the_imported_configuration(tmp_path):
    assert import_run(make_run(tmp_path), tmp_path / "imported") == 0
    assert main(["replay", str(tmp_path / "imported"), "--cost-model", "roofline", "--model", "llama-3.1-8b",
                 "--hardware", "h100", "--max-num-seqs", "2", "--no-async-scheduling", "--no-progress", "--json",
                 "--trace", str(tmp_path / "replay")]) == 0
    scheduler = traces.load(tmp_path / "replay").meta["config"]["scheduler"]
    assert scheduler["max_num_seqs"] == 2 and scheduler["async_scheduling"] is False


def test_request_metrics_are_means_and_percentiles_by_the_peer_s_definitions(imported):
    m = request_metrics(imported)
    # ttft = first_token - arrival: 0.25, 0.75, 0.5, 0.25; tpot over >1 output tokens: 0.125, 0.3125, 0.5;
    # latency = finish - arrival: 0.5, 2.0, 0.5, 0.75.
    assert m["ttft_mean"] == pytest.approx(0.4375) and m["ttft_p50"] == pytest.approx(0.375)
    assert m["tpot_mean"] == pytest.approx((0.125 + 0.3125 + 0.5) / 3)
    assert m["latency_mean"] == pytest.approx(0.9375) and m["latency_p50"] == pytest.approx(0.625)
    assert set(m) == {f"{n}_{s}" for n in ("ttft", "tpot", "latency") for s in ("mean", "p50", "p90", "p99")}


def test_request_metrics_take_a_trace_directory(tmp_path, imported):
    assert request_metrics(tmp_path / "trace") == request_metrics(imported)


def test_compare_reports_means_beside_the_percentiles(tmp_path, imported, capsys):
    assert main(["compare", str(tmp_path / "trace"), str(tmp_path / "trace"), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["ttft_mean_s"]["a"] == pytest.approx(0.4375) and metrics["e2e_mean_s"]["b"] == pytest.approx(0.9375)
    assert list(metrics)[:4] == ["ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s"]


def test_compare_of_an_imported_run_and_its_replay_skips_step_sections_and_says_why(tmp_path, capsys):
    assert import_run(make_run(tmp_path), tmp_path / "imported") == 0
    assert main(["replay", str(tmp_path / "imported"), "--cost-model", "roofline", "--model", "llama-3.1-8b",
                 "--hardware", "h100", "--no-progress", "--json", "--trace", str(tmp_path / "replay")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "imported"), str(tmp_path / "replay")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("step-level comparison skipped: A has requests but no steps or decisions")
    assert any(line.startswith("ttft mean") for line in out)
    assert not any(line.startswith(("decision match", "step time MAPE", "error breakdown")) for line in out)
