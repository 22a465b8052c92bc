"""The workload package: specs, arrival processes, length distributions, prefixes, trace importers, errors."""
import inspect
import json
import subprocess
import sys
import tracemalloc
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from workloads import (DEFAULT_WORKLOAD, WORKLOADS_DIR, WorkloadError, load_workload, read_trace,
                       workload_from_dict)

DATA = WORKLOADS_DIR / "data"
AZURE_CODE = DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE_CONV = DATA / "mooncake_fast25" / "conversation_trace.jsonl"
BUNDLED = ["bursty", "poisson", "onoff", "prefix_heavy", "long_context", "azure_code", "azure_conv",
           "mooncake_conversation"]


def spec(**over) -> dict:
    d = {"name": "t", "seed": 1, "num_requests": 50, "arrival": {"process": "poisson", "rate": 10.0},
         "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 4}}
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def arrivals(d: dict, n: int) -> np.ndarray:
    return np.array([r.arrival for r in workload_from_dict(spec(**d, num_requests=n)).requests()])


def lengths(dist: dict, n: int = 20000) -> np.ndarray:
    w = workload_from_dict(spec(num_requests=n, output_tokens=dist))
    return np.array([r.max_tokens for r in w.requests()])


def as_tuples(w, **kw) -> list:
    return [(r.request_id, r.arrival, r.prompt_token_ids, r.max_tokens) for r in w.requests(**kw)]


def test_same_seed_gives_identical_requests():
    d = spec(num_requests=300, prompt_tokens={"dist": "lognormal", "median": 40, "sigma": 0.5},
             prefix={"groups": 3, "tokens": 16, "fraction": 0.5})
    assert as_tuples(workload_from_dict(d)) == as_tuples(workload_from_dict(d))


def test_different_seed_gives_different_requests():
    a, b = as_tuples(workload_from_dict(spec(seed=1))), as_tuples(workload_from_dict(spec(seed=2)))
    assert [r[1] for r in a] != [r[1] for r in b] and [r[2] for r in a] != [r[2] for r in b]


def test_request_ids_follow_arrival_order_from_time_zero():
    reqs = list(workload_from_dict(spec()).requests())
    assert [r.request_id for r in reqs] == [f"w{i}" for i in range(50)]
    assert reqs[0].arrival == 0.0 and all(a.arrival <= b.arrival for a, b in zip(reqs, reqs[1:]))


def test_token_ids_stay_in_range_and_skip_special_ids():
    w = workload_from_dict(spec(num_requests=500))
    ids = np.concatenate([r.prompt_token_ids for r in w.requests(vocab_size=10)])
    assert ids.min() == 3 and ids.max() == 9


@pytest.mark.parametrize("arrival, expected_rate", [
    ({"process": "poisson", "rate": 5.0}, 5.0),
    ({"process": "gamma", "rate": 5.0, "cv": 2.0}, 5.0),
    ({"process": "constant", "rate": 5.0}, 5.0),
    ({"process": "onoff", "rate": 6.0, "on": 2.0, "off": 4.0}, 2.0),
])
def test_arrival_process_mean_rate(arrival, expected_rate):
    t = arrivals({"arrival": arrival}, 40000)
    assert (len(t) - 1) / t[-1] == pytest.approx(expected_rate, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_gaps_have_configured_cv(cv):
    gaps = np.diff(arrivals({"arrival": {"process": "gamma", "rate": 2.0, "cv": cv}}, 60000))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_onoff_has_no_arrivals_in_off_periods():
    t = arrivals({"arrival": {"process": "onoff", "rate": 20.0, "on": 1.5, "off": 3.0}}, 5000)
    phase = np.mod(t, 4.5)
    assert (phase < 1.5).all() and (phase > 1.4).any()


@pytest.mark.parametrize("dist, center, statistic", [
    ({"dist": "fixed", "value": 7}, 7, np.mean),
    ({"dist": "uniform", "min": 10, "max": 30}, 20, np.mean),
    ({"dist": "normal", "mean": 100, "std": 10, "min": 70, "max": 130}, 100, np.mean),
    ({"dist": "lognormal", "median": 200, "sigma": 0.8, "min": 20, "max": 2000}, 200, np.median),
    ({"dist": "zipf", "a": 1.5, "min": 1, "max": 100}, 2, np.median),
    ({"dist": "empirical", "values": [5, 50, 500], "weights": [1, 8, 1], "min": 6, "max": 400}, 50, np.median),
])
def test_length_distribution_respects_clip_and_center(dist, center, statistic):
    x = lengths(dist)
    assert x.min() >= dist.get("min", 1) and x.max() <= dist.get("max", x.max())
    assert statistic(x) == pytest.approx(center, rel=0.03)


def test_empirical_weights_set_frequencies():
    x = lengths({"dist": "empirical", "values": [3, 9], "weights": [1, 3]})
    assert set(x.tolist()) == {3, 9} and np.mean(x == 9) == pytest.approx(0.75, abs=0.02)


def test_prefix_fraction_and_shared_content():
    w = workload_from_dict(spec(num_requests=4000, prompt_tokens={"dist": "uniform", "min": 40, "max": 80},
                                prefix={"groups": 2, "tokens": 32, "fraction": 0.6}))
    heads = [tuple(r.prompt_token_ids[:32]) for r in w.requests()]
    counts = sorted((heads.count(h) for h in set(heads)), reverse=True)
    assert len(set(heads)) > 1000 and sum(counts[:2]) / len(heads) == pytest.approx(0.6, abs=0.03)
    assert counts[2] == 1


def test_prefix_extends_short_prompts_past_the_prefix():
    w = workload_from_dict(spec(prompt_tokens={"dist": "fixed", "value": 10},
                                prefix={"groups": 1, "tokens": 32, "fraction": 1.0}))
    reqs = list(w.requests())
    assert {len(r.prompt_token_ids) for r in reqs} == {33}
    assert len({tuple(r.prompt_token_ids[:32]) for r in reqs}) == 1 and len({r.prompt_token_ids[32] for r in reqs}) > 1


def test_azure_importer_reads_copied_files():
    code = list(read_trace(AZURE_CODE, "azure"))
    assert len(code) == 8819 and len(list(read_trace(AZURE_CONV, "azure"))) == 19366
    assert (code[0].arrival, code[0].prompt_tokens, code[0].output_tokens) == (0.0, 4808, 10)
    assert code[1].arrival == pytest.approx(0.052) and (code[1].prompt_tokens, code[1].output_tokens) == (3180, 8)
    assert 3400 < code[-1].arrival < 3500


def test_mooncake_importer_converts_ms_to_seconds():
    rows = list(read_trace(MOONCAKE_CONV, "mooncake"))
    raw = [json.loads(line) for line in MOONCAKE_CONV.open().readlines()[:400]]
    later = next(i for i, r in enumerate(raw) if r["timestamp"] > 0)
    assert len(rows) == 12031 and (rows[0].prompt_tokens, rows[0].output_tokens) == (6758, 500)
    assert rows[later].arrival == pytest.approx(raw[later]["timestamp"] / 1000.0)
    assert rows[0].hash_ids == list(range(14))


def test_mooncake_shared_hash_ids_give_identical_blocks():
    w = load_workload(WORKLOADS_DIR / "mooncake_conversation.yaml")
    a, b, c = [r.prompt_token_ids for r in w.requests(limit=3)]
    assert (len(a), len(b)) == (6758, 7322)
    assert a[:512] == b[:512] == c[:512]
    assert a[512:1024] != b[512:1024]


def test_mooncake_pads_prompts_longer_than_their_blocks(tmp_path):
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [5]},
            {"timestamp": 3000, "input_length": 600, "output_length": 2, "hash_ids": [5]}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = workload_from_dict({"arrival": {"process": "trace", "format": "mooncake", "path": "m.jsonl"}},
                           base_dir=tmp_path)
    a, b = list(w.requests())
    assert len(a.prompt_token_ids) == 600 and a.prompt_token_ids[:512] == b.prompt_token_ids[:512]
    assert a.prompt_token_ids[512:] != b.prompt_token_ids[512:] and b.arrival == 3.0


def test_trace_num_requests_takes_first_rows():
    w = workload_from_dict({"num_requests": 5, "arrival": {"process": "trace", "format": "azure",
                                                           "path": str(AZURE_CODE)}})
    assert [len(r.prompt_token_ids) for r in w.requests()] == [4808, 3180, 110, 7433, 34]


def test_limit_caps_the_count_and_keeps_the_same_requests():
    w = workload_from_dict(spec(num_requests=100))
    assert as_tuples(w, limit=7) == as_tuples(w)[:7]


def test_time_scale_multiplies_arrivals():
    w = workload_from_dict(spec())
    assert [r.arrival for r in w.requests(time_scale=0.5)] == pytest.approx([r.arrival * 0.5 for r in w.requests()])


def test_duration_stops_at_the_last_arrival_inside_it():
    t = arrivals({"duration": 30.0, "arrival": {"process": "constant", "rate": 2.0}}, None)
    assert len(t) == 61 and t[-1] == pytest.approx(30.0)


def test_scaled_shrinks_count_lengths_and_speeds_up_arrivals():
    w = workload_from_dict(spec(num_requests=200, prompt_tokens={"dist": "fixed", "value": 100},
                                prefix={"groups": 1, "tokens": 50, "fraction": 1.0}))
    s = w.scaled(num_requests=20, length_factor=0.1, rate_factor=2.0)
    small, big = list(s.requests()), list(w.requests())
    assert len(small) == 20 and {len(r.prompt_token_ids) for r in small} == {10} and small[0].max_tokens == 1
    assert [r.arrival for r in small] == pytest.approx([r.arrival / 2 for r in big[:20]])
    assert w.spec.num_requests == 200


def test_scaled_trace_compresses_time_and_lengths():
    w = load_workload(WORKLOADS_DIR / "azure_code.yaml")
    s = w.scaled(length_factor=0.01, rate_factor=4.0)
    a, b = list(w.requests(limit=3)), list(s.requests(limit=3))
    assert [len(r.prompt_token_ids) for r in b] == [48, 32, 1]
    assert [r.arrival for r in b] == pytest.approx([r.arrival / 4 for r in a])


def test_to_dict_round_trips():
    w = load_workload(WORKLOADS_DIR / "azure_conv.yaml")
    again = workload_from_dict(w.to_dict())
    assert again.name == "azure_conv" and as_tuples(again, limit=20) == as_tuples(w, limit=20)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_workload_loads_and_streams(name):
    w = load_workload(WORKLOADS_DIR / f"{name}.yaml")
    reqs = list(w.requests(limit=5))
    assert w.name == name and len(reqs) == 5 and all(r.prompt_token_ids and r.max_tokens >= 1 for r in reqs)


def test_default_workload_is_the_design_example():
    d = load_workload(DEFAULT_WORKLOAD).to_dict()
    assert d["arrival"] == {"process": "gamma", "rate": 4.0, "cv": 3.0} and d["num_requests"] == 400
    assert d["prefix"] == {"groups": 4, "tokens": 256, "fraction": 0.5} and d["seed"] == 7


BAD_YAML = {
    "negative_rate": ("arrival: {process: poisson, rate: -2}", "arrival.rate"),
    "zero_cv": ("arrival: {process: gamma, rate: 2, cv: 0}", "arrival.cv"),
    "unknown_process": ("arrival: {process: weibull, rate: 2}", "arrival.process"),
    "unknown_dist": ("arrival: {process: poisson, rate: 2}\nprompt_tokens: {dist: pareto}", "prompt_tokens.dist"),
    "min_above_max": ("arrival: {process: poisson, rate: 2}\nprompt_tokens: {dist: uniform, min: 9, max: 3}",
                      "prompt_tokens.max"),
    "typo": ("arrival: {process: poisson, rate: 2, rtae: 3}", "arrival.rtae"),
    "unknown_format": ("arrival: {process: trace, format: parquet, path: x}", "arrival.format"),
    "missing_trace": ("arrival: {process: trace, format: csv, path: nowhere.csv}", "arrival.path"),
    "bad_yaml": ("arrival: {process: poisson\n", "line 5"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_bad_workload_file_names_file_and_field(tmp_path, case):
    body, field = BAD_YAML[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text("name: bad\nnum_requests: 3\n" + body + "\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(path)
    message = str(e.value)
    assert message.startswith(f"{path}: {field}: ") and "\n" not in message


def test_a_bad_workload_file_lists_every_problem_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nnum_requests: 3\narrival: {process: poisson, rate: 2, rtae: 3}\n"
                    "prompt_tokens: {dist: uniform, min: 9, max: 3}\nseeed: 1\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(path)
    message = str(e.value)
    assert "\n" not in message and all(f in message for f in ("arrival.rtae", "prompt_tokens.max", "seeed")), message

def test_missing_workload_file_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match="nope.yaml: file: no such file"):
        load_workload(tmp_path / "nope.yaml")


def test_malformed_trace_row_names_its_line(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,5,5\n0.5,7,2\n1.0,abc,4\n")
    w = workload_from_dict({"arrival": {"process": "trace", "format": "csv", "path": "t.csv"}}, base_dir=tmp_path)
    with pytest.raises(WorkloadError, match=r"t\.csv: line 4: prompt_tokens 'abc' is not a number"):
        list(w.requests())


def test_trace_going_back_in_time_is_rejected(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"arrival": 2, "prompt_tokens": 3, "output_tokens": 1}\n'
                                      '{"arrival": 1, "prompt_tokens": 3, "output_tokens": 1}\n')
    w = workload_from_dict({"arrival": {"process": "trace", "format": "jsonl", "path": "t.jsonl"}}, base_dir=tmp_path)
    with pytest.raises(WorkloadError, match=r"t\.jsonl: line 2: arrival 1 s is before"):
        list(w.requests())


def test_requests_stream_in_bounded_memory():
    w = workload_from_dict(spec(num_requests=200_000, prompt_tokens={"dist": "uniform", "min": 1, "max": 4}))
    stream = w.requests(vocab_size=200)  # ids below 256 are interned ints: memory is the requests' own
    assert inspect.isgenerator(stream)
    tracemalloc.start()  # traced over the first 20k only (tracing is slow); a list would be built by then
    first = sum(1 for _ in islice(stream, 20_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert first + sum(1 for _ in stream) == 200_000
    assert peak < 2 * 2**20  # 200k requests held in a list take about 40 MiB


def test_workloads_import_without_torch():
    code = ("import sys, importlib.abc\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ImportError('blocked')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import workloads; next(workloads.load_workload(workloads.DEFAULT_WORKLOAD).requests())\n"
            "print('torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_count_is_known_for_request_counts_and_traces_but_not_durations():
    from workloads import load_workload

    root = Path(__file__).parents[1] / "workloads"
    assert load_workload(root / "bursty.yaml").count() == 400
    assert load_workload(root / "bursty.yaml").count(limit=7) == 7
    assert load_workload(root / "azure_conv.yaml").count() == 19366
    assert load_workload(root / "onoff.yaml").count(limit=7) is None


def test_bench_memory_workload_is_200k_poisson_requests():
    from workloads import load_workload

    w = load_workload(Path(__file__).parents[1] / "bench" / "workloads" / "poisson_200k.yaml")
    assert w.count() == 200_000 and w.to_dict()["arrival"]["process"] == "poisson"
    assert all(16 <= r.max_tokens <= 128 for r in w.requests(limit=50))


# LLMServingSim's workload rows, shaped as in its sharegpt-*.jsonl files (ids cut short, one shared prefix).
_SHARED = list(range(5971, 6003))  # 32 ids: two full blocks of 16
LLMSERVINGSIM_ROWS = [
    {"input_toks": 36, "output_toks": 5, "arrival_time_ns": 46926808, "input_tok_ids": _SHARED + [220, 1032, 97, 5],
     "output_tok_ids": [1, 2, 3, 4, 5]},
    {"input_toks": 3, "output_toks": 7, "arrival_time_ns": 347938951, "input_tok_ids": [128000, 13191, 499]},
    {"input_toks": 35, "output_toks": 4, "arrival_time_ns": 479613520, "input_tok_ids": _SHARED + [88, 77, 66]},
]


def _llmservingsim(tmp_path: Path, rows: list[dict] = LLMSERVINGSIM_ROWS, **extra) -> Path:
    (tmp_path / "lss.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "lss.yaml").write_text(json.dumps({"arrival": {"process": "trace", "format": "llmservingsim",
                                                               "path": "lss.jsonl"}, **extra}))
    return tmp_path / "lss.yaml"


def test_llmservingsim_trace_keeps_the_real_prompt_ids_arrivals_and_output_lengths(tmp_path):
    reqs = list(load_workload(_llmservingsim(tmp_path)).requests(vocab_size=4096))
    assert [r.prompt_token_ids for r in reqs] == [r["input_tok_ids"] for r in LLMSERVINGSIM_ROWS]
    assert [r.arrival for r in reqs] == pytest.approx([0.046926808, 0.347938951, 0.479613520])
    assert [r.max_tokens for r in reqs] == [5, 7, 4]


def test_llmservingsim_length_scale_cuts_prompts_and_keeps_their_shared_start(tmp_path):
    reqs = list(load_workload(_llmservingsim(tmp_path, length_scale=0.5)).requests())
    assert [len(r.prompt_token_ids) for r in reqs] == [18, 2, 18]
    assert reqs[0].prompt_token_ids == reqs[2].prompt_token_ids == _SHARED[:18]


def test_llmservingsim_input_toks_other_than_the_ids_names_its_line(tmp_path):
    rows = [LLMSERVINGSIM_ROWS[0], {**LLMSERVINGSIM_ROWS[1], "input_toks": 4}]
    w = load_workload(_llmservingsim(tmp_path, rows))
    with pytest.raises(WorkloadError, match=r"lss\.jsonl: line 2: input_toks 4 is not the length of input_tok_ids"):
        list(w.requests())


def test_llmservingsim_token_id_that_is_not_an_integer_names_its_line(tmp_path):
    rows = [{**LLMSERVINGSIM_ROWS[0], "input_toks": 2, "input_tok_ids": [5, "x"]}]
    with pytest.raises(WorkloadError, match=r"lss\.jsonl: line 1: input_tok_ids\[1\] 'x' is not a token id"):
        load_workload(_llmservingsim(tmp_path, rows))


def test_llmservingsim_trace_takes_no_prefix_groups(tmp_path):
    with pytest.raises(WorkloadError, match="prefix: not allowed with llmservingsim"):
        load_workload(_llmservingsim(tmp_path, prefix={"groups": 1, "tokens": 8, "fraction": 0.5}))


def test_llmservingsim_equal_prompt_prefixes_hit_the_prefix_cache_in_a_replay(tmp_path):
    import traces
    from sim.cli import main

    assert main(["replay", str(_llmservingsim(tmp_path)), "--model", "llama-3.1-8b", "--hardware", "h100",
                 "--block-size", "16", "--enable-prefix-caching", "--no-progress", "--json",
                 "--trace", str(tmp_path / "t")]) == 0
    cached = traces.load(tmp_path / "t").requests.set_index("request_id")["num_cached_tokens"]
    assert cached.to_dict() == {"w0": 0, "w1": 0, "w2": 32}


def test_json_trace_line_past_the_length_cap_names_its_line_without_reading_it_whole(tmp_path, monkeypatch):
    import workloads.importers as importers

    monkeypatch.setattr(importers, "MAX_LINE_CHARS", 200)
    rows = [LLMSERVINGSIM_ROWS[1], {**LLMSERVINGSIM_ROWS[1], "input_toks": 100, "input_tok_ids": [7] * 100}]
    w = load_workload(_llmservingsim(tmp_path, rows))
    with pytest.raises(WorkloadError, match=r"lss\.jsonl: line 2: longer than"):
        list(w.requests())
