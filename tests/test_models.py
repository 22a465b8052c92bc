"""Our Llama/Qwen2/Qwen3 decoder, loaded from tiny HF checkpoints, reproduces HF's logits, paged cache or not."""
from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engine.model_executor.forward_context import build_attn_metadata, set_forward_context
from engine.model_executor.layers.rotary_embedding import compute_inv_freq, rope_params_from_config
from engine.model_executor.loader import kv_cache_spec, load_model
from trace_builders import save_random_hf_model

DEVICE = torch.device("cpu")
SHAPE = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=512, max_position_embeddings=256,
)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
ARCHS = {
    # llama: llama3 rope scaling (head_dim 16 puts frequencies in all three bands) and bias on q/k/v/o
    "llama": (LlamaForCausalLM, lambda: LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE, attention_bias=True)),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(**SHAPE, rope_theta=1e6, tie_word_embeddings=False)),
    # qwen3: head_dim decoupled from hidden/heads, q/k norm, tied embeddings
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(**SHAPE, head_dim=32, tie_word_embeddings=True)),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def pair(request, tmp_path_factory):
    """(HF reference model, our model loaded from its saved safetensors)."""
    hf_cls, make_config = ARCHS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    # larger-than-init weights so a mapping mistake shows far above tolerance
    hf = save_random_hf_model(hf_cls, make_config(), path, weight_scale=0.1)
    ours = load_model(hf.config, path, "safetensors", torch.float32, DEVICE)
    return hf, ours


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(tokens[None]).logits[0].float()


class PagedRunner:
    """A minimal runner: one cache per layer, steps given as (tokens, block_table, start, end) per sequence."""

    def __init__(self, model, num_blocks: int, block_size: int) -> None:
        self.model, self.block_size = model, block_size
        spec = kv_cache_spec(model.config)
        for layer in model.attention_layers():
            layer.kv_cache = torch.zeros(2, num_blocks, block_size, spec.num_kv_heads, spec.head_size)

    @torch.no_grad()
    def step(self, entries) -> list[torch.Tensor]:
        ids = torch.cat([tokens[s:e] for tokens, _, s, e in entries])
        pos = torch.cat([torch.arange(s, e) for _, _, s, e in entries])
        meta = build_attn_metadata([e - s for *_, s, e in entries], [e for *_, e in entries],
                                   [t for _, t, _, _ in entries], self.block_size, DEVICE)
        with set_forward_context(meta):
            logits = self.model.compute_logits(self.model(ids, pos))
        return list(logits.split([e - s for *_, s, e in entries]))


def assert_logits_close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_full_prompt_logits_match_hf(pair):
    hf, ours = pair
    tokens = torch.randint(0, 512, (19,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = ours.compute_logits(ours(tokens, torch.arange(19)))
    assert logits.dtype == torch.float32 and logits.shape == (19, 512)
    assert_logits_close(logits, hf_logits(hf, tokens))


def test_paged_prefill_then_decodes_match_hf(pair):
    hf, ours = pair
    tokens = torch.randint(0, 512, (14,), generator=torch.Generator().manual_seed(2))
    ref = hf_logits(hf, tokens)
    runner = PagedRunner(ours, num_blocks=8, block_size=4)
    table = [6, 1, 4, 2]  # deliberately not the identity
    assert_logits_close(runner.step([(tokens, table, 0, 7)])[0], ref[:7])
    for pos in range(7, 14):
        assert_logits_close(runner.step([(tokens, table, pos, pos + 1)])[0], ref[pos : pos + 1])


def test_chunked_prefill_matches_hf(pair):
    hf, ours = pair
    tokens = torch.randint(0, 512, (23,), generator=torch.Generator().manual_seed(3))
    ref = hf_logits(hf, tokens)
    runner = PagedRunner(ours, num_blocks=8, block_size=16)
    table = [5, 2]
    for start, end in [(0, 6), (6, 17), (17, 23)]:  # the second chunk straddles the block boundary
        assert_logits_close(runner.step([(tokens, table, start, end)])[0], ref[start:end])


def test_mixed_decode_and_prefill_chunk_batch_matches_hf(pair):
    hf, ours = pair
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randint(0, 512, (10,), generator=gen), torch.randint(0, 512, (12,), generator=gen)
    ref_a, ref_b = hf_logits(hf, a), hf_logits(hf, b)
    runner = PagedRunner(ours, num_blocks=12, block_size=4)
    table_a, table_b = [3, 9, 0], [7, 1, 10]
    runner.step([(a, table_a, 0, 8)])
    out_a, out_b = runner.step([(a, table_a, 8, 9), (b, table_b, 0, 5)])
    assert_logits_close(out_a, ref_a[8:9])
    assert_logits_close(out_b, ref_b[:5])
    out_a, out_b = runner.step([(a, table_a, 9, 10), (b, table_b, 5, 12)])
    assert_logits_close(out_a, ref_a[9:10])
    assert_logits_close(out_b, ref_b[5:12])


def test_llama3_rope_frequencies_match_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    theta, scaling = rope_params_from_config(config)
    actual = compute_inv_freq(16, theta, scaling)
    torch.testing.assert_close(actual, expected.float(), atol=0, rtol=0)
    assert not torch.equal(actual, compute_inv_freq(16, theta, None))


def test_unsupported_rope_scaling_is_rejected():
    with pytest.raises(ValueError, match="yarn"):
        compute_inv_freq(16, 10000.0, {"rope_type": "yarn", "factor": 4.0})
