"""bench/throughput.py's greedy agreement with transformers means what it says: both sides run the same
weights (the built-in model saved as a checkpoint), and where they cannot (a preset's dummy weights) no
figure is printed."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cpu_cases  # noqa: E402
import throughput  # noqa: E402


def test_the_built_in_model_is_compared_on_the_engines_own_weights(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from engine import LLM, SamplingParams

    path = cpu_cases.shared_checkpoint(None, cache=tmp_path)
    assert path is not None and (path / "model.safetensors").is_file()
    prompts = [[5, 17, 42, 99, 7], [300, 12, 8, 1000, 64, 3]]
    llm = LLM(model=None, device="cpu", max_model_len=64, kv_cache_memory=4 << 20)
    ours = [list(o.outputs[0].token_ids) for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        use_tqdm=False)]
    llm.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    theirs = []
    with torch.no_grad():
        for p in prompts:
            gen = hf.generate(torch.tensor([p]), max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
            theirs.append(gen[0, len(p):].tolist())
    assert throughput.agreement(ours, theirs, first=8) == pytest.approx(1.0)


def test_a_preset_shares_no_checkpoint_and_prints_no_agreement_figure():
    assert cpu_cases.shared_checkpoint("qwen3-0.6b") is None
    line = throughput.agreement_line([[1, 2]], [[3, 4]], None)
    assert "not compared" in line and "%" not in line


def test_the_agreement_figure_is_printed_for_a_shared_checkpoint(tmp_path):
    assert throughput.agreement_line([[1, 2]], [[1, 3]], tmp_path) == (
        "greedy agreement with transformers, first 32 tokens: 50.0 %")
