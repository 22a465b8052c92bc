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
