"""`sim import-run` refuses a run that contradicts itself or its workload, or holds a number no run can hold:
one line naming the file, the row and the field, exit status 2, rather than a trace built on a misreading."""
import pytest

from test_import_run import BENCH, ENGINE_KWARGS, REQUESTS, _with, import_bench, import_run, make_run


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("sim import-run: error: ")
    return err


# --- vllm bench serve results -----------------------------------------------------------------------------

def test_bench_output_length_past_the_max_tokens_the_workload_asked_for_is_refused(tmp_path, capsys):
    # Row 1 of the workload asks for 5 output tokens; the result says 9 came back.
    assert import_bench(tmp_path, {**BENCH, "output_lens": [3, 9, 0]}) == 2
    err = _one_error_line(capsys)
    assert "result.json: output_lens[1]: bench-1 has 9 output tokens, more than the 5" in err


def test_bench_itls_whose_sum_overflows_are_refused(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "itls": [[1e308, 1e308], [0.25] * 4, []]}) == 2
    assert "result.json: itls[0]" in _one_error_line(capsys)


def test_bench_itls_summing_past_any_request_s_latency_are_refused(tmp_path, capsys):
    # Each gap alone is a plausible (if long) wait; together they outlast any run.
    assert import_bench(tmp_path, {**BENCH, "itls": [[6e7, 6e7], [0.25] * 4, []]}) == 2
    assert "result.json: itls[0]: inter-token latencies sum to 1.2e+08 s" in _one_error_line(capsys)


def test_bench_ttft_past_any_run_is_refused(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "ttfts": [1e300, 0.5, 0.0]}) == 2
    assert "result.json: ttfts[0]: ttft 1e+300 is more than" in _one_error_line(capsys)


def test_bench_start_time_past_any_clock_is_refused(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "start_times": [1000.5, 1e300, 1001.0]}) == 2
    assert "result.json: start_times[1]: start time 1e+300 is more than" in _one_error_line(capsys)


def test_bench_output_length_past_any_context_is_refused(tmp_path, capsys):
    assert import_bench(tmp_path, {**BENCH, "output_lens": [3, 10**30, 0]}) == 2
    assert "result.json: output_lens[1]: output length" in _one_error_line(capsys)


def test_bench_request_rate_that_is_not_finite_is_refused(tmp_path, capsys):
    # JSON's Infinity: vLLM itself writes an unlimited rate as the string "inf", which is kept.
    assert import_bench(tmp_path, {**BENCH, "request_rate": float("inf")}) == 2
    assert "result.json: request_rate: inf is not a finite number" in _one_error_line(capsys)


# --- LLMServingSim run bundles ----------------------------------------------------------------------------

def test_bundle_with_fewer_requests_than_its_meta_declares_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, requests=REQUESTS[:3], num_requests=4), tmp_path / "t") == 2
    err = _one_error_line(capsys)
    assert "requests.jsonl: line 3: num_requests: the file ends after 3 requests, but" in err
    assert "meta.json declares 4" in err


def test_bundle_num_requests_that_is_not_a_count_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, num_requests="many"), tmp_path / "t") == 2
    assert "meta.json: num_requests: 'many' is not a request count" in _one_error_line(capsys)


def test_workload_given_with_the_flag_whose_sha256_is_not_the_dataset_hash_is_refused(tmp_path, capsys):
    run = make_run(tmp_path, dataset_hash="0" * 64)
    assert import_run(run, tmp_path / "t", "--workload", str(tmp_path / "workloads" / "sharegpt-tiny.jsonl")) == 2
    err = _one_error_line(capsys)
    assert "sharegpt-tiny.jsonl: --workload: sha256 differs from the run's dataset_hash" in err
    assert "meta.json" in err


def test_dataset_hash_that_is_not_a_sha256_digest_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, dataset_hash=12345), tmp_path / "t") == 2
    assert "meta.json: dataset_hash: 12345 is not a sha256 digest" in _one_error_line(capsys)


def test_bundle_output_tokens_past_what_the_workload_asked_for_are_refused(tmp_path, capsys):
    # Row 1 of the workload asks for 5 output tokens (vLLM bench's max_tokens); the run says 7 came back.
    assert import_run(make_run(tmp_path, requests=_with(1, output_toks=7)), tmp_path / "t") == 2
    err = _one_error_line(capsys)
    assert "requests.jsonl: line 2: output_toks: bench-1 has 7 output tokens, more than the 5" in err


def test_bundle_token_count_past_any_context_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, requests=_with(0, output_toks=10**30)), tmp_path / "t") == 2
    assert "requests.jsonl: line 1: output_toks 1000000000000000000000000000000 is more than" in \
        _one_error_line(capsys)


def test_bundle_stamp_past_any_clock_is_refused(tmp_path, capsys):
    assert import_run(make_run(tmp_path, requests=_with(0, last_token_ts=1e300)), tmp_path / "t") == 2
    assert "requests.jsonl: line 1: last_token_ts 1e+300 is more than" in _one_error_line(capsys)


@pytest.mark.parametrize("key, value", [("tensor_parallel_size", 0), ("data_parallel_size", 10**30),
                                        ("max_num_seqs", 10**30), ("seed", -1), ("block_size", 10**30)])
def test_engine_argument_outside_its_bounds_is_refused_naming_it(tmp_path, capsys, key, value):
    assert import_run(make_run(tmp_path, engine_kwargs={**ENGINE_KWARGS, key: value}), tmp_path / "t") == 2
    assert f"meta.json: engine_kwargs.{key}: " in _one_error_line(capsys)
