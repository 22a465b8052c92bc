"""A bad request fails alone with a reason and the engine keeps serving; a shut-down engine refuses new
requests instead of running them past its closed trace."""
import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=3, temperature=0.0)


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", max_num_seqs=4)


def test_a_prompt_the_tokenizer_cannot_encode_fails_alone(llm):
    outs = llm.generate(["good one", "bad \udcff", "another"], GREEDY, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "length"]
    assert "cannot encode" in outs[1].outputs[0].stop_reason
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(["still serving"], GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_generate_after_shutdown_is_refused():
    llm = LLM(device="cpu", max_num_seqs=2)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(["x"], GREEDY, use_tqdm=False)


def test_a_text_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(llm, monkeypatch):
    def no_tokenizing(*_a, **_k):
        raise AssertionError("tokenized")

    huge = "word " * (llm.llm_engine.input_processor.max_prompt_chars // 5 + 1)
    monkeypatch.setattr(llm.llm_engine.input_processor.tokenizer, "encode", no_tokenizing)
    out = llm.generate([huge], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "error" and "not tokenized" in out.error


def test_the_prompt_bound_never_refuses_a_text_that_fits(llm):
    text = "x" * llm.llm_engine.input_processor.max_prompt_chars
    n = len(llm.get_tokenizer().encode(text, add_special_tokens=False))
    out = llm.generate([text], GREEDY, use_tqdm=False)[0]
    assert "not tokenized" not in (out.error or "") and (out.error is None) == (n <= 4096)


LONG = """
name: long
seed: 1
num_requests: 12
arrival: {process: poisson, rate: 50}
prompt_tokens: {dist: empirical, values: [30000000, 5000, 40], weights: [1, 1, 4]}
output_tokens: {dist: fixed, value: 2}
"""


def _long_workload(tmp_path):
    from workloads import load_workload

    (tmp_path / "long.yaml").write_text(LONG)
    return load_workload(tmp_path / "long.yaml")


def test_a_workload_prompt_over_the_cap_comes_without_ids_and_the_others_are_unchanged(tmp_path):
    workload = _long_workload(tmp_path)
    capped = list(workload.requests(vocab_size=4096, max_prompt_tokens=4096))
    refused = [r for r in capped if r.prompt_token_ids is None]
    assert {r.num_prompt_tokens for r in refused} == {30_000_000, 5000}
    whole = [r for r in workload.requests(vocab_size=4096) if r.num_prompt_tokens <= 5000]
    assert [(r.request_id, r.prompt_token_ids) for r in capped if r.prompt_token_ids is not None] == \
        [(r.request_id, r.prompt_token_ids) for r in whole if r.num_prompt_tokens <= 4096]


def test_engine_run_refuses_an_over_long_workload_prompt_with_its_true_length(tmp_path):
    import traces
    from engine.config import EngineArgs
    from engine.llm_engine import LLMEngine
    from engine.workload_driver import run_workload

    engine = LLMEngine.from_engine_args(EngineArgs(device="cpu", trace=str(tmp_path / "t")))
    run_workload(engine, _long_workload(tmp_path), progress=False)
    engine.shutdown()
    req = traces.load(tmp_path / "t").requests.set_index("request_id")
    errors = req[req["finish_reason"] == "error"]
    assert set(errors["num_prompt_tokens"]) == {30_000_000, 5000}
    assert all("longer than max_model_len=4096" in e for e in errors["error"])
    assert (req["finish_reason"] != "error").sum() == len(req) - len(errors) > 0


def _count_prompt_ids(monkeypatch) -> list[int]:
    from engine.core import request

    made = []
    init = request.Request.__init__

    def counting(self, rid, ids, *a, **k):
        made.append(len(ids))
        init(self, rid, ids, *a, **k)

    monkeypatch.setattr(request.Request, "__init__", counting)
    return made


def test_sim_replay_refuses_an_over_long_workload_prompt_without_making_its_ids(tmp_path, monkeypatch):
    import traces
    from sim.cli import main as sim_main

    (tmp_path / "long.yaml").write_text(LONG)
    made = _count_prompt_ids(monkeypatch)
    assert sim_main(["replay", str(tmp_path / "long.yaml"), "--max-model-len", "4096", "--no-progress",
                     "--trace", str(tmp_path / "t")]) == 0
    assert max(made) <= 5000
    req = traces.load(tmp_path / "t").requests
    errors = req[req["finish_reason"] == "error"]
    assert set(errors["num_prompt_tokens"]) == {30_000_000, 5000}


def test_sim_plan_refuses_an_over_long_workload_prompt_without_making_its_ids(tmp_path, monkeypatch, capsys):
    from sim.cli import main as sim_main

    (tmp_path / "long.yaml").write_text(LONG)
    made = _count_prompt_ids(monkeypatch)
    assert sim_main(["plan", str(tmp_path / "long.yaml"), "--slo", "ttft_p99=2s", "--max-model-len", "4096",
                     "--hardware", "h100", "--jobs", "1", "--no-progress"]) == 0
    assert made and max(made) <= 5000
    assert "rejected: prompt longer than max_model_len=4096" in capsys.readouterr().out


def test_an_over_long_token_prompt_is_traced_by_its_length_not_its_ids(tmp_path):
    import traces

    llm = LLM(device="cpu", max_num_seqs=2, trace=str(tmp_path / "t"))
    out = llm.generate([{"prompt_token_ids": [5] * 50_000}, {"prompt_token_ids": [5, 6]}], GREEDY, use_tqdm=False)
    llm.shutdown()
    assert [o.outputs[0].finish_reason for o in out] == ["error", "length"]
    req = traces.load(tmp_path / "t").requests.set_index("request_id")
    refused = req.loc[out[0].request_id]
    assert refused["num_prompt_tokens"] == 50_000 and len(refused["prompt_token_ids"]) == 0
