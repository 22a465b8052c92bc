"""Mixture-of-Experts models (Qwen3-MoE, Mixtral): the engine's greedy tokens equal transformers' `generate`
on the same random checkpoint, and the checkpoint's per-expert tensors land in the stacked experts."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (GenerationConfig, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from engine import LLM, SamplingParams
from engine.builtin import BUILTIN_DIR
from engine.model_executor.layers.moe import SparseMoeBlock, route
from engine.model_executor.loader import load_model
from engine.model_executor.models.llama import LlamaMLP
from engine.model_executor.models.registry import get_model_class, resolve_architecture
from trace_builders import save_random_hf_model

SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
             max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             tie_word_embeddings=False)
NEW_TOKENS = 10
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
PROMPT_LENGTHS = [5, 11, 17]


def qwen3_moe_config(norm_topk_prob: bool) -> Qwen3MoeConfig:
    # sparse_step 2 over 4 layers: layers 1 and 3 would be sparse, but 3 is mlp_only -> only layer 1 is MoE
    return Qwen3MoeConfig(**SHAPE, num_hidden_layers=4, head_dim=32, intermediate_size=96,
                          moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                          norm_topk_prob=norm_topk_prob, decoder_sparse_step=2, mlp_only_layers=[3])


def mixtral_config() -> MixtralConfig:
    return MixtralConfig(**SHAPE, num_hidden_layers=2, intermediate_size=32, num_local_experts=4,
                         num_experts_per_tok=2)


def save_checkpoint(path: Path, cls: type, config) -> torch.nn.Module:
    """A random HF model saved as safetensors with the built-in tokenizer beside it; returns the HF model."""
    hf = save_random_hf_model(cls, config, path, weight_scale=0.15)  # peaked logits: no near-ties
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(BUILTIN_DIR / f, path / f)
    return hf


def prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 4000, (k,), generator=g).tolist() for k in PROMPT_LENGTHS]


def hf_greedy(hf: torch.nn.Module, prompt: list[int]) -> list[int]:
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), generation_config=gen)
    return out[0, len(prompt):].tolist()


def engine_greedy(path: Path, batch: list[list[int]]) -> list[list[int]]:
    llm = LLM(str(path), device="cpu", max_model_len=256, kv_cache_memory=8 << 20)
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_greedy_matches_hf(path: Path, hf: torch.nn.Module, seed: int) -> None:
    batch = prompts(seed)
    assert engine_greedy(path, batch) == [hf_greedy(hf, p) for p in batch]


def test_qwen3_moe_greedy_tokens_match_transformers(tmp_path):
    hf = save_checkpoint(tmp_path, Qwen3MoeForCausalLM, qwen3_moe_config(norm_topk_prob=True))
    assert_greedy_matches_hf(tmp_path, hf, seed=1)


def test_qwen3_moe_without_topk_renormalisation_matches_transformers(tmp_path):
    hf = save_checkpoint(tmp_path, Qwen3MoeForCausalLM, qwen3_moe_config(norm_topk_prob=False))
    assert_greedy_matches_hf(tmp_path, hf, seed=2)


def test_mixtral_greedy_tokens_match_transformers(tmp_path):
    hf = save_checkpoint(tmp_path, MixtralForCausalLM, mixtral_config())
    assert_greedy_matches_hf(tmp_path, hf, seed=3)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_full_prompt_logits_match_transformers(arch, tmp_path):
    cls, config = ((Qwen3MoeForCausalLM, qwen3_moe_config(norm_topk_prob=True)) if arch == "qwen3_moe"
                   else (MixtralForCausalLM, mixtral_config()))
    hf = save_checkpoint(tmp_path, cls, config)
    ours = load_model(hf.config, tmp_path, "safetensors", torch.float32, "cpu")
    tokens = torch.randint(10, 4000, (19,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = ours.compute_logits(ours(tokens, torch.arange(19)))
        expected = hf(tokens[None]).logits[0].float()
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_qwen3_moe_sparse_layers_follow_sparse_step_and_mlp_only_layers():
    model = get_model_class("Qwen3MoeForCausalLM")(qwen3_moe_config(norm_topk_prob=True))
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [LlamaMLP, SparseMoeBlock, LlamaMLP, LlamaMLP]
    moe = model.model.layers[1].mlp
    assert isinstance(moe, SparseMoeBlock)
    assert (moe.num_experts, moe.top_k, moe.w2_weight.shape[2]) == (8, 2, 32)


def test_moe_architectures_resolve_from_model_type_alone():
    for config, arch in ((Qwen3MoeConfig(), "Qwen3MoeForCausalLM"), (MixtralConfig(), "MixtralForCausalLM")):
        assert config.architectures is None
        assert resolve_architecture(config) == arch
        assert get_model_class(arch).__name__ == arch


def test_expert_tensors_fill_their_rows_of_the_stacked_experts(tmp_path):
    hf = save_checkpoint(tmp_path, MixtralForCausalLM, mixtral_config())
    moe = load_model(hf.config, tmp_path, "safetensors", torch.float32, "cpu").model.layers[1].mlp
    assert isinstance(moe, SparseMoeBlock)
    theirs = load_file(tmp_path / "model.safetensors")
    for e in range(4):
        prefix = f"model.layers.1.block_sparse_moe.experts.{e}"
        assert torch.equal(moe.w13_weight[e, :32], theirs[f"{prefix}.w1.weight"])
        assert torch.equal(moe.w13_weight[e, 32:], theirs[f"{prefix}.w3.weight"])
        assert torch.equal(moe.w2_weight[e], theirs[f"{prefix}.w2.weight"])
    assert torch.equal(moe.gate.weight, theirs["model.layers.1.block_sparse_moe.gate.weight"])


def test_checkpoint_missing_one_expert_tensor_is_rejected(tmp_path):
    save_checkpoint(tmp_path, MixtralForCausalLM, mixtral_config())
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 weights.*model\.layers\.0\.mlp\.w13_weight"):
        LLM(str(tmp_path), device="cpu", max_model_len=256, kv_cache_memory=8 << 20)


def test_graph_safe_all_experts_path_equals_the_sparse_path():
    torch.manual_seed(0)
    block = SparseMoeBlock(64, 32, num_experts=8, top_k=2, renormalize=True, weights_in_hidden_dtype=False)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.15)
        x = torch.randn(13, 64)
        weights, ids = route(block.gate(x), block.top_k, block.renormalize)
        torch.testing.assert_close(block.forward_all_experts(x, weights, ids), block(x), atol=1e-5, rtol=1e-5)


def test_the_cost_models_refuse_a_moe_shape_they_cannot_price():
    """The engine runs MoE models; the simulator's cost models price dense ones only, so they say so."""
    from engine.core.model_shapes import check_model_config

    with pytest.raises(ValueError, match="model_type 'qwen3_moe' is not supported; dense"):
        check_model_config(qwen3_moe_config(norm_topk_prob=True).to_dict(), "qwen3-moe")


def test_a_moe_config_with_more_experts_per_token_than_experts_is_one_line():
    from engine.core.model_shapes import check_model_config

    cfg = {**mixtral_config().to_dict(), "num_experts_per_tok": 5}
    with pytest.raises(ValueError, match="num_experts_per_tok 5 is more than the 4 experts"):
        check_model_config(cfg, "mixtral", moe=True)


def test_qwen3_30b_a3b_preset_builds_the_public_shape_without_allocating_it():
    """On the meta device: the preset's 48 sparse layers of 128 experts, top-8 renormalised, and the
    published 30.5B weights, with nothing materialised."""
    from engine.model_executor.loader import build_model
    from engine.model_executor.presets import get_preset, hf_config_from_dict

    model = build_model(hf_config_from_dict(get_preset("qwen3-30b-a3b")), torch.bfloat16, "meta")
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 48 and all(p.is_meta for p in model.parameters())
    assert {(b.num_experts, b.top_k, b.renormalize, b.w2_weight.shape[2]) for b in blocks} == {(128, 8, True, 768)}
    assert abs(sum(p.numel() for p in model.parameters()) / 1e9 - 30.5) < 0.1


def test_qwen3_30b_a3b_preset_resolves_to_an_engine_config(monkeypatch):
    import engine.config
    from engine.config import EngineArgs

    # A machine with room for its 122 GB of float32 weights; this one is refused in one line (test_engine_config).
    monkeypatch.setattr(engine.config, "device_memory_bytes", lambda device: (1 << 40, "memory this machine has"))
    config = EngineArgs(model="qwen3-30b-a3b", device="cpu", max_model_len=4096).create_engine_config()
    hf = config.model_config.hf_config
    assert (config.model_config.source, hf.model_type, hf.num_experts, hf.num_key_value_heads) == \
        ("preset", "qwen3_moe", 128, 4)
