"""Start-up refuses a context the model cannot address, unless the model config is overridden as in vLLM."""
import pytest

from engine import LLM, SamplingParams
from engine.cli import main
from engine.config import EngineArgs


def test_max_model_len_beyond_max_position_embeddings_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"max_model_len: 8192 .* max_position_embeddings=4096"):
        EngineArgs(device="cpu", max_model_len=8192).create_engine_config()


def test_hf_overrides_raise_the_position_limit():
    config = EngineArgs(device="cpu", max_model_len=8192,
                        hf_overrides={"max_position_embeddings": 8192}).create_engine_config()
    assert config.model_config.max_model_len == 8192
    assert config.model_config.hf_config.max_position_embeddings == 8192


def test_hf_overrides_lowering_the_limit_refuse_a_longer_context():
    with pytest.raises(ValueError, match=r"max_model_len: 64 .* max_position_embeddings=48"):
        LLM(device="cpu", max_model_len=64, hf_overrides={"max_position_embeddings": 48})


def test_hf_overrides_given_as_json_text_are_parsed():
    config = EngineArgs(device="cpu", hf_overrides='{"max_position_embeddings": 64}').create_engine_config()
    assert config.model_config.max_model_len == 64


def test_context_filling_the_overridden_position_table_runs():
    llm = LLM(device="cpu", kv_cache_memory=8 << 20, max_model_len=64, hf_overrides={"max_position_embeddings": 64})
    out = llm.generate({"prompt_token_ids": list(range(10, 70))},
                       SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 4


def test_cli_max_model_len_too_long_is_one_line_exit_2(capsys):
    assert main(["generate", "--device", "cpu", "--max-model-len", "8192", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "8192" in err and "4096" in err


@pytest.mark.parametrize("text,what", [("{bad", "not valid JSON"), ("[1]", "must be a JSON object")])
def test_cli_bad_hf_overrides_is_one_line_exit_2(capsys, text, what):
    assert main(["generate", "--device", "cpu", "--hf-overrides", text, "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("engine generate: error: --hf-overrides:") and what in err


def test_fp8_kv_cache_with_flash_attn_is_refused_in_one_line_naming_the_backends():
    with pytest.raises(ValueError, match="kv_cache_dtype: fp8 runs on the torch or triton attention backend"):
        EngineArgs(device="cpu", kv_cache_dtype="fp8", attention_backend="flash-attn").create_engine_config()


def test_cli_fp8_kv_cache_with_flash_attn_is_one_line_exit_2(capsys):
    assert main(["generate", "--kv-cache-dtype", "fp8", "--attention-backend", "flash-attn", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("engine generate: error: --kv-cache-dtype: fp8")


def test_fp8_kv_cache_is_float8_e4m3fn_beside_the_model_dtype():
    config = EngineArgs(device="cpu", kv_cache_dtype="fp8").create_engine_config()
    assert (config.model_config.dtype, config.model_config.kv_dtype) == ("float32", "float8_e4m3fn")


def test_weights_larger_than_the_memory_are_refused_in_one_line(monkeypatch):
    import engine.config

    monkeypatch.setattr(engine.config, "device_memory_bytes", lambda device: (1 << 30, "memory this machine has"))
    with pytest.raises(ValueError, match="qwen3-0.6b's 3.0 GB of float32 weights are more than the 1.0 GiB"):
        EngineArgs(model="qwen3-0.6b", device="cpu").create_engine_config()
