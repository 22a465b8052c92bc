"""A checkpoint or config the engine cannot use ends `engine generate` with one line naming the file and
field, exit status 2, never a traceback: cut-short or garbage weights, a broken tokenizer or config, a
field of the wrong type or range (in config.json or through --hf-overrides), an attention backend the
device cannot run, sampling parameters of the wrong type."""
import json

import pytest

from engine import SamplingParams
from engine.cli import main as engine_main
from engine.vllm_backend.checkpoint import save_builtin_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_builtin_checkpoint(tmp_path_factory.mktemp("ckpt"), 0)


def _fails_in_one_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert engine_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_damaged_weights_are_one_line_naming_the_file(checkpoint, tmp_path, capsys, damage):
    ck = _copy(checkpoint, tmp_path / "ck")
    data = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(data[: len(data) // 2] if damage == "cut" else b"garbage")
    assert "model.safetensors" in _fails_in_one_line(capsys, ["generate", "--model", str(ck), "hi"])


def test_an_unparsable_tokenizer_is_one_line(checkpoint, tmp_path, capsys):
    ck = _copy(checkpoint, tmp_path / "ck")
    (ck / "tokenizer.json").write_text("{bad")
    assert "tokenizer" in _fails_in_one_line(capsys, ["generate", "--model", str(ck), "hi"])


@pytest.mark.parametrize("content", ["", "[1, 2]"])
def test_an_empty_or_non_object_config_is_one_line(checkpoint, tmp_path, capsys, content):
    ck = _copy(checkpoint, tmp_path / "ck")
    (ck / "config.json").write_text(content)
    assert "config.json" in _fails_in_one_line(capsys, ["generate", "--model", str(ck), "hi"])


@pytest.mark.parametrize("field,value", [("hidden_size", "256"), ("num_hidden_layers", -1),
                                         ("num_key_value_heads", 3), ("vocab_size", 0)])
def test_a_config_field_of_the_wrong_type_or_range_is_one_line_naming_it(checkpoint, tmp_path, capsys, field, value):
    ck = _copy(checkpoint, tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, field: value}))
    assert field in _fails_in_one_line(capsys, ["generate", "--model", str(ck), "hi"])


@pytest.mark.parametrize("field,value", [("hidden_size", "256"), ("num_hidden_layers", -1),
                                         ("num_key_value_heads", 3), ("vocab_size", 0)])
def test_an_hf_override_of_the_wrong_type_or_range_is_one_line_naming_it(capsys, field, value):
    line = _fails_in_one_line(capsys, ["generate", "--hf-overrides", json.dumps({field: value}), "hi"])
    assert field in line


def test_triton_attention_on_a_cpu_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "triton" in _fails_in_one_line(capsys, ["generate", "--device", "cpu", "--attention-backend", "triton",
                                                   "hi"])


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p"])
def test_sampling_params_of_the_wrong_type_name_the_field(field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}: must be a number"):
        SamplingParams(**{field: "0.5"})
