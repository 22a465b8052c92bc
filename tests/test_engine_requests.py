"""Requests through the whole engine on the built-in model: bad ones fail alone, stops and outputs."""
import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128)


def test_bad_requests_fail_alone_with_a_reason(llm):
    good = SamplingParams(max_tokens=4, temperature=0.0)
    outs = llm.generate(["Hello there", "", {"prompt_token_ids": list(range(5, 300))},
                         {"prompt_token_ids": [5, 99999]}, {"prompt_token_ids": [5, 6, 7]}], good, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "error", "error", "length"]
    assert "empty" in outs[1].error
    assert "max_model_len" in outs[2].error
    assert "vocabulary" in outs[3].error
    assert len(outs[0].outputs[0].token_ids) == 4 and len(outs[4].outputs[0].token_ids) == 4


def test_invalid_sampling_params_name_the_field():
    with pytest.raises(ValueError, match="SamplingParams.top_p"):
        SamplingParams(top_p=2.0)


def test_unknown_engine_argument_is_named():
    with pytest.raises(ValueError, match="max_num_seq"):
        LLM(device="cpu", max_num_seq=4)


def test_engine_flag_out_of_range_names_the_field():
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(device="cpu", max_num_seqs=0)


def test_kv_budget_too_small_for_max_model_len_says_which_flags_to_change():
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        LLM(device="cpu", num_gpu_blocks_override=3, max_model_len=128)


def test_stop_string_ends_the_request_and_is_excluded(llm):
    tok = llm.get_tokenizer()
    free = llm.generate(["The"], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    text = free.outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), text
    out = llm.generate(["The"], SamplingParams(max_tokens=12, temperature=0.0, stop=[stop], ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[:text.index(stop)]
    assert tok is not None


def test_stop_token_id_ends_the_request(llm):
    free = llm.generate(["Once"], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    target = free.outputs[0].token_ids[3]
    out = llm.generate(["Once"], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[target]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.outputs[0].token_ids[:free.outputs[0].token_ids.index(target) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == target


def test_min_tokens_keeps_stop_tokens_out_until_reached(llm):
    free = llm.generate(["Once"], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    first = free.outputs[0].token_ids[0]
    out = llm.generate(["Once"], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[first],
                                                min_tokens=3), use_tqdm=False)[0].outputs[0]
    assert first not in out.token_ids[:3] and len(out.token_ids) >= 3


def test_logprobs_are_returned_per_token(llm):
    out = llm.generate(["Hi"], SamplingParams(max_tokens=3, temperature=0.0, logprobs=2), use_tqdm=False)[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == 3
    for tok, lp in zip(comp.token_ids, comp.logprobs):
        assert tok in lp and len(lp) <= 3
        assert lp[tok] == max(lp.values())
    assert comp.cumulative_logprob == pytest.approx(sum(lp[t] for t, lp in zip(comp.token_ids, comp.logprobs)))


def test_outputs_come_back_in_prompt_order(llm):
    prompts = [{"prompt_token_ids": [5] * n} for n in (40, 3, 20, 1)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
    assert [len(o.prompt_token_ids) for o in outs] == [40, 3, 20, 1]


def test_out_of_memory_at_start_up_names_the_flags_to_change(monkeypatch):
    from engine.worker.worker import Worker

    class OutOfMemoryError(RuntimeError):
        pass

    def boom(self, num_blocks):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    monkeypatch.setattr(Worker, "initialize_cache", boom)
    with pytest.raises(ValueError, match="allocate KV cache: out of device memory; lower --gpu-memory-utilization"):
        LLM(device="cpu", kv_cache_memory=16 << 20, max_model_len=128)
