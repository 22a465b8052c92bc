"""The engine's greedy output is token-identical to transformers' `generate` on the same weights."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from engine import LLM, SamplingParams
from engine.builtin import BUILTIN_DIR
from trace_builders import save_random_hf_model

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=4096, max_position_embeddings=512,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
ARCHS = {
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE)),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(**SHAPE, rope_theta=1e6, tie_word_embeddings=False)),
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(**SHAPE, head_dim=32, tie_word_embeddings=True)),
}
NEW_TOKENS = 12
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


def _prompts(n: int, lengths: list[int], prefix: list[int] | None = None) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [(prefix or []) + torch.randint(10, 4000, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request, tmp_path_factory):
    """A tiny random HF model saved as safetensors with the built-in tokenizer beside it."""
    cls, make_config = ARCHS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    # peaked logits: near-ties would make greedy comparisons flaky
    hf = save_random_hf_model(cls, make_config(), path, weight_scale=0.15)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(BUILTIN_DIR / f, path / f)
    return path, hf


def hf_greedy(hf, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    gen = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), generation_config=gen)
    return out[0, len(prompt):].tolist()


def engine_greedy(path, prompts, **engine_args) -> list[list[int]]:
    engine_args.setdefault("kv_cache_memory", 8 << 20)
    llm = LLM(str(path), device="cpu", max_model_len=256, **engine_args)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


def test_cpu_float32_steps_take_every_fused_kernel(checkpoint, monkeypatch):
    from engine.model_executor.layers import cpu_ops

    if cpu_ops.load() is None:
        pytest.skip("no C compiler for the CPU kernels")
    taken = set()

    def counted(name, kernel):
        def call(*args):
            out = kernel(*args)
            if out is not None:
                taken.add(name)
            return out
        return call

    for name in ("rms_norm", "qk_norm_rope", "silu_and_mul"):
        monkeypatch.setattr(cpu_ops, name, counted(name, getattr(cpu_ops, name)))
    engine_greedy(checkpoint[0], _prompts(5, [9, 14]))
    assert taken == {"rms_norm", "qk_norm_rope", "silu_and_mul"}


def test_the_torch_path_without_the_fused_kernels_matches_transformers(checkpoint, monkeypatch):
    from engine.model_executor.layers import cpu_ops

    monkeypatch.setattr(cpu_ops, "load", lambda: None)
    path, hf = checkpoint
    prompts = _prompts(6, [11, 23])
    got, _ = engine_greedy(path, prompts)
    assert got == [hf_greedy(hf, p) for p in prompts]


def test_single_prompt_matches_transformers(checkpoint):
    path, hf = checkpoint
    prompt = _prompts(1, [17])[0]
    got, _ = engine_greedy(path, [prompt])
    assert got[0] == hf_greedy(hf, prompt)


def test_batch_of_mixed_lengths_matches_transformers(checkpoint):
    path, hf = checkpoint
    prompts = _prompts(2, [3, 40, 17, 64, 1, 25])
    got, _ = engine_greedy(path, prompts)
    assert got == [hf_greedy(hf, p) for p in prompts]


def test_chunked_prefill_matches_transformers(checkpoint):
    path, hf = checkpoint
    prompts = _prompts(3, [70, 45, 9])
    got, llm = engine_greedy(path, prompts, max_num_batched_tokens=16)
    assert got == [hf_greedy(hf, p) for p in prompts]


def test_prefix_cache_hits_match_transformers(checkpoint):
    path, hf = checkpoint
    shared = _prompts(4, [48])[0]
    prompts = _prompts(5, [5, 11, 20], prefix=shared)
    llm = LLM(str(path), device="cpu", max_model_len=256, kv_cache_memory=8 << 20, block_size=16)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], GREEDY, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens == 48 for o in rest)
    assert [o.outputs[0].token_ids for o in first + rest] == [hf_greedy(hf, p) for p in prompts]


def test_preemption_and_recompute_match_transformers(checkpoint):
    path, hf = checkpoint
    prompts = _prompts(6, [30, 22, 35, 18])
    # 9 usable blocks of 8 tokens: four requests growing to ~45 tokens cannot all stay resident.
    llm = LLM(str(path), device="cpu", max_model_len=64, num_gpu_blocks_override=10, block_size=8)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)
    core = llm.llm_engine.engine_core.engine_core
    assert core.num_preemptions > 0
    assert core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 9
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 24) for p in prompts]


def test_seeded_sampling_is_reproducible_whatever_the_batch(checkpoint):
    path, _ = checkpoint
    prompt = {"prompt_token_ids": _prompts(7, [12])[0]}
    seeded = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=1234)
    llm = LLM(str(path), device="cpu", max_model_len=256, kv_cache_memory=8 << 20)
    alone = llm.generate([prompt], seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": p} for p in _prompts(8, [5, 30, 9])]
    mixed = llm.generate([others[0], prompt, *others[1:]],
                         [SamplingParams(max_tokens=10, temperature=1.0), seeded,
                          SamplingParams(max_tokens=10, temperature=0.5, seed=7), GREEDY], use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone
