"""A checkpoint's own Python code never runs unless the user passes --trust-remote-code, and nothing is
ever asked on stdin: transformers prompts for `auto_map` code when trust_remote_code is left unset."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ('{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1, '
          '"num_attention_heads": 2, "vocab_size": 100, "intermediate_size": 128, "auto_map": '
          '{"AutoConfig": "configuration_evil.EvilConfig", "AutoTokenizer": ["tokenization_evil.EvilTokenizer", null]}}')
CODE = ('import pathlib\npathlib.Path(__file__).with_name("RAN").write_text("ran")\n'
        'from transformers import LlamaConfig\nclass EvilConfig(LlamaConfig):\n    model_type = "llama"\n')


def test_a_checkpoint_s_auto_map_code_does_not_run_even_when_stdin_says_yes(tmp_path):
    (tmp_path / "config.json").write_text(CONFIG)
    (tmp_path / "configuration_evil.py").write_text(CODE)
    (tmp_path / "tokenization_evil.py").write_text(CODE)
    (tmp_path / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", '
                                                   'null]}}')
    out = subprocess.run([sys.executable, "-m", "engine.cli", "generate", "--model", str(tmp_path), "hi"],
                         input="y\ny\n", capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert not (tmp_path / "RAN").exists()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "[y/N]" not in out.stdout + out.stderr
