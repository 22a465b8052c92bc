"""A checkpoint without tokenizer files: skip_tokenizer_init=True serves token ids, tokenizer=PATH borrows one
(vLLM's names for both)."""
import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine import LLM, SamplingParams
from engine.builtin import BUILTIN_DIR

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
IDS = {"prompt_token_ids": [17, 230, 41, 9]}
ENGINE = dict(device="cpu", kv_cache_memory=8 << 20, max_model_len=64)


@pytest.fixture(scope="module")
def bare_checkpoint(tmp_path_factory):
    """The built-in model's shape with random weights, saved with config.json and safetensors only."""
    from engine.core.model_shapes import get_model_config

    fields = get_model_config("builtin")
    config = Qwen3Config(**{k: v for k, v in fields.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bare")
    Qwen3ForCausalLM(config).save_pretrained(path)
    assert not any(path.glob("tokenizer*")), sorted(p.name for p in path.iterdir())
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 4096
    return path


def test_checkpoint_without_tokenizer_needs_an_option_and_says_which(bare_checkpoint):
    with pytest.raises(ValueError, match=r"tokenizer: no tokenizer files .* skip_tokenizer_init=True"):
        LLM(str(bare_checkpoint), **ENGINE)


def test_skip_tokenizer_init_serves_token_ids_with_no_text(bare_checkpoint):
    llm = LLM(str(bare_checkpoint), skip_tokenizer_init=True, **ENGINE)
    skipped = llm.generate(IDS, GREEDY, use_tqdm=False)[0]
    borrowed = LLM(str(bare_checkpoint), tokenizer=str(BUILTIN_DIR), **ENGINE).generate(IDS, GREEDY, use_tqdm=False)[0]
    assert llm.get_tokenizer() is None
    assert skipped.outputs[0].token_ids == borrowed.outputs[0].token_ids
    assert len(skipped.outputs[0].token_ids) == 5 and skipped.outputs[0].text == ""


def test_skip_tokenizer_init_refuses_text_prompts_and_stop_strings_clearly(bare_checkpoint):
    llm = LLM(str(bare_checkpoint), skip_tokenizer_init=True, **ENGINE)
    text, stop = llm.generate(["Hello", IDS], [GREEDY, SamplingParams(max_tokens=5, stop=["x"])], use_tqdm=False)
    assert text.outputs[0].finish_reason == "error" and stop.outputs[0].finish_reason == "error"
    assert "prompt: text needs a tokenizer and the engine was started with skip_tokenizer_init=True" in text.error
    assert "SamplingParams.stop: stop strings need a tokenizer" in stop.error


def test_tokenizer_path_serves_text_prompts(bare_checkpoint):
    llm = LLM(str(bare_checkpoint), tokenizer=str(BUILTIN_DIR), **ENGINE)
    out = llm.generate("Hello there", GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert out.prompt_token_ids == llm.get_tokenizer().encode("Hello there", add_special_tokens=False)
    assert out.outputs[0].text == llm.get_tokenizer().decode(out.outputs[0].token_ids)
