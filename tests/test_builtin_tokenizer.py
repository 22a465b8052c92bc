import pytest

from engine.builtin import BUILTIN_DIR
from engine.config import EngineArgs
from engine.tokenizer import get_tokenizer
from tools.build_tokenizer import EOS_TOKEN, build

TEXTS = [
    "The scheduler admitted 3 requests at 09:45; each used 16-token blocks.",
    "今天天气很好，我们去公园散步吧。这个模型很小。",
    "Launch 🚀, relax 🙂, weird ones 🦄🧑‍🚀 and flags 🇯🇵!",
    "def f(x):\n    return {'a': [1, 2.5, None]}  # café naïve",
]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(BUILTIN_DIR)


def test_rebuild_gives_byte_identical_tokenizer_json(tmp_path):
    build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / name).read_bytes() == (BUILTIN_DIR / name).read_bytes(), name


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text


def test_multibyte_text_uses_merged_tokens(tokenizer):
    text = "我们去公园"
    assert len(tokenizer.encode(text)) < len(text.encode("utf-8"))


def test_eos_and_chat_tokens_resolve(tokenizer):
    assert tokenizer.is_fast and len(tokenizer) == 4096
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.eos_token_id == 0
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and ids[-1] == 2


def test_config_loads_and_matches_tokenizer(tokenizer):
    config = EngineArgs(device="cpu").create_engine_config().model_config.hf_config
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == config.bos_token_id == tokenizer.eos_token_id
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (256, 4, 32)
    assert (config.num_attention_heads, config.num_key_value_heads) == (8, 4)
    assert config.tie_word_embeddings


def test_get_tokenizer_rejects_directory_without_tokenizer(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        get_tokenizer(tmp_path)
