"""Faults never wedge the engine: a step that raises ends only its own requests, with the error, and the
next generate() is served as if nothing happened; requests that would fail inside a step are refused
before one starts, alone."""
import numpy as np
import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(20, 60))}]


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128)


def _runner(llm):
    return llm.llm_engine.engine_core.engine_core.executor.driver_worker.model_runner


def _block_pool(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _fail_once(llm, monkeypatch, method: str, after_calls: int = 0):
    """Make the runner's `method` raise on its (after_calls+1)-th call, then behave again."""
    runner = _runner(llm)
    real = getattr(runner, method)
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == after_calls + 1:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, method, flaky)


def test_failing_forward_ends_its_requests_with_the_error(llm, monkeypatch):
    _fail_once(llm, monkeypatch, "execute_model")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["error", "error"]
    assert all(o.error == "RuntimeError: injected fault" for o in outs)


def test_failing_step_leaves_the_block_pool_fully_free(llm, monkeypatch):
    _fail_once(llm, monkeypatch, "execute_model", after_calls=2)
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    pool = _block_pool(llm)
    assert pool.get_num_free_blocks() == pool.num_usable_blocks
    assert not llm.llm_engine.engine_core.engine_core.scheduler.requests


def test_generate_after_a_failed_step_gives_the_same_tokens(llm, monkeypatch):
    before = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    with monkeypatch.context() as m:
        _fail_once(llm, m, "sample_tokens", after_calls=1)
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == before


def test_failed_step_spares_requests_it_did_not_schedule(monkeypatch):
    llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128, max_num_seqs=1)
    expected = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    _fail_once(llm, monkeypatch, "execute_model")
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error"
    assert outs[1].outputs[0].finish_reason == "length" and outs[1].outputs[0].token_ids == expected[1]


@pytest.mark.parametrize("bad_params,field", [
    (dict(stop_token_ids=[99999], min_tokens=2), "stop_token_ids"),
    (dict(seed=2**63 - 1, temperature=1.0), None),
])
def test_bad_request_among_good_ones_fails_alone(llm, bad_params, field):
    expected = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    bad = SamplingParams(max_tokens=6, **bad_params)
    outs = llm.generate([PROMPTS[0], {"prompt_token_ids": [9, 10, 11]}, PROMPTS[1]], [GREEDY, bad, GREEDY],
                        use_tqdm=False)
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == expected
    if field is None:  # the largest seed vLLM accepts runs like any other
        assert outs[1].outputs[0].finish_reason == "length"
    else:
        assert outs[1].outputs[0].finish_reason == "error" and field in outs[1].error


def test_stop_token_id_outside_vocabulary_is_refused_naming_request_and_field(llm):
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(stop_token_ids=[4096]), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "error"
    assert out.error.startswith(f"request {out.request_id}: SamplingParams.stop_token_ids: 4096")


def test_bool_is_not_a_token_id(llm):
    out = llm.generate({"prompt_token_ids": [5, True, 7]}, GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "error"
    assert "prompt_token_ids[1]: True is not a token id" in out.error


def test_numpy_integers_are_token_ids(llm):
    plain = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)[0]
    as_numpy = llm.generate([{"prompt_token_ids": [np.int64(5), np.int32(6), np.uint16(7)]},
                             {"prompt_token_ids": np.array([5, 6, 7])}], GREEDY, use_tqdm=False)
    assert _tokens(as_numpy) == [plain.outputs[0].token_ids] * 2


@pytest.mark.parametrize("ids,what", [([5, -1], "-1 is outside"), ([5, 4096], "4096 is outside"),
                                      ([5, 2.0], "2.0 is not a token id")])
def test_token_id_outside_vocabulary_or_not_an_int_is_refused(llm, ids, what):
    out = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "error" and what in out.error
    assert out.error.startswith(f"request {out.request_id}: prompt_token_ids")


def test_failed_step_is_in_the_trace_with_its_requests_ended_by_the_error(tmp_path, monkeypatch):
    import traces

    llm = LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128, trace=str(tmp_path))
    _fail_once(llm, monkeypatch, "execute_model", after_calls=1)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    llm.shutdown()
    t = traces.load(tmp_path)
    rows = t.requests.set_index("request_id")
    for out in outs:
        assert rows.loc[out.request_id, "finish_reason"] == "error"
        assert rows.loc[out.request_id, "error"] == "RuntimeError: injected fault"
    assert t.complete and len(t.requests) == 3 and rows.loc["2", "finish_reason"] == "length"
    finishes = t.decisions[t.decisions["event"] == "finish"]
    assert set(finishes["request_id"]) == {"0", "1", "2"}


def test_cli_sampling_seed_beyond_64_bits_is_one_line_exit_2(capsys):
    from engine.cli import main

    assert main(["generate", "--device", "cpu", "--sampling-seed", str(2**64), "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("engine generate: error: SamplingParams.seed:")
