"""`--kv-cache-dtype fp8`: K/V stored as float8 e4m3 (saturating at +-448), widened on read, half of bf16's
bytes per block, and greedy tokens measured against the model's own cache dtype."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine import LLM, SamplingParams
from engine.model_executor.attention import cpu_native, torch_backend
from engine.model_executor.forward_context import build_attn_metadata
from trace_builders import save_random_hf_model

FP8 = torch.float8_e4m3fn
NEW_TOKENS = 32
NUM_PROMPTS = 16


def _core(llm: LLM):
    return llm.llm_engine.engine_core.engine_core


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The random Qwen3 of the transformers parity tests (tests/test_engine_vs_hf.py)."""
    config = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=4096, max_position_embeddings=512, head_dim=32,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("qwen3")
    save_random_hf_model(Qwen3ForCausalLM, config, path, weight_scale=0.15)
    return path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 4000, (int(n),), generator=g).tolist()
            for n in torch.randint(4, 40, (NUM_PROMPTS,), generator=g)]


def _llm(path, kv_cache_dtype: str) -> LLM:
    return LLM(str(path), device="cpu", max_model_len=256, kv_cache_memory=8 << 20, skip_tokenizer_init=True,
               max_num_seqs=NUM_PROMPTS * NEW_TOKENS, kv_cache_dtype=kv_cache_dtype)


def _greedy(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                          use_tqdm=False)]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for p, q in zip(a, b) for x, y in zip(p, q)) / sum(map(len, a))


def test_fp8_picks_the_same_next_token_as_the_model_dtype_cache_given_the_same_context(checkpoint, prompts):
    # Teacher-forced: every prefix of the float32 run's output, one step each through the fp8 cache.
    reference = _greedy(_llm(checkpoint, "auto"), prompts, NEW_TOKENS)
    contexts = [p + out[:i] for p, out in zip(prompts, reference) for i in range(NEW_TOKENS)]
    chosen = _greedy(_llm(checkpoint, "fp8"), contexts, 1)
    assert _agreement([[t for out in reference for t in out]], [[c[0] for c in chosen]]) >= 0.85


def test_fp8_free_running_greedy_agreement_stays_above_its_measured_floor(checkpoint, prompts):
    # Free-running: one flip among this random model's near-tied logits changes the rest of that sequence,
    # so the share is far lower than the teacher-forced one above.
    auto = _greedy(_llm(checkpoint, "auto"), prompts, NEW_TOKENS)
    assert _agreement(auto, _greedy(_llm(checkpoint, "fp8"), prompts, NEW_TOKENS)) >= 0.2


def test_fp8_tokens_equal_a_float32_cache_holding_fp8_rounded_values(checkpoint, prompts, monkeypatch):
    fp8 = _greedy(_llm(checkpoint, "fp8"), prompts, 8)
    cast = torch_backend.to_cache_dtype
    monkeypatch.setattr(torch_backend, "to_cache_dtype", lambda x, dtype: cast(cast(x, FP8), dtype))
    monkeypatch.setattr(torch_backend, "as_cached", lambda x, kv_cache: cast(cast(x, FP8), x.dtype))
    assert _greedy(_llm(checkpoint, "auto"), prompts, 8) == fp8


def test_fp8_cache_is_stored_as_float8_e4m3fn():
    llm = LLM(device="cpu", kv_cache_memory=4 << 20, max_model_len=128, kv_cache_dtype="fp8")
    caches = _core(llm).executor.driver_worker.runner.kv_caches
    assert caches and all(c.dtype == FP8 for c in caches)
    out = llm.generate({"prompt_token_ids": [5, 17, 42, 8] * 5}, SamplingParams(max_tokens=4, temperature=0.0),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4 and caches[0].view(torch.uint8).any()


@pytest.mark.parametrize("dtype,ratio", [("bfloat16", 2), ("float32", 4)])
def test_fp8_holds_more_blocks_in_the_same_kv_cache_memory(dtype, ratio):
    blocks = {kv: _core(LLM(device="cpu", dtype=dtype, kv_cache_memory=4 << 20, max_model_len=128,
                            kv_cache_dtype=kv)).kv_report.num_blocks for kv in ("auto", "fp8")}
    assert blocks["fp8"] == ratio * blocks["auto"]


def test_fp8_run_records_its_kv_cache_dtype_in_the_trace_model_config(tmp_path):
    import traces

    llm = LLM(device="cpu", kv_cache_memory=4 << 20, max_model_len=128, kv_cache_dtype="fp8", trace=str(tmp_path))
    llm.generate({"prompt_token_ids": [5, 17, 42]}, SamplingParams(max_tokens=2), use_tqdm=False)
    llm.shutdown()
    assert traces.load(tmp_path).meta["config"]["model"]["kv_cache_dtype"] == "fp8"


def test_store_saturates_at_fp8_max_and_reads_back_rounded():
    cache = torch.zeros(2, 2, 4, 1, 4, dtype=FP8)
    key = torch.tensor([[[1000.0, -1e9, 0.3, float("inf")]]])
    torch_backend.reshape_and_cache(key, -key, cache, torch.tensor([5]))
    assert cache[0, 1, 1, 0].float().tolist() == [448.0, -448.0, 0.3125, 448.0]
    assert cache[1, 1, 1, 0].float().tolist() == [-448.0, 448.0, -0.3125, -448.0]


def _decode_batch(q_dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    seq_lens = [1, 17, 40, 67]
    tables = [[2 + i * 5 + j for j in range(5)] for i in range(4)]
    meta = build_attn_metadata([1] * 4, seq_lens, tables, 16, "cpu")
    cache = (3 * torch.randn(2, 24, 16, 2, 64, generator=g)).to(FP8)
    return torch.randn(4, 8, 64, generator=g).to(q_dtype), cache, meta


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_native_decode_on_an_fp8_cache_matches_the_widened_cache(q_dtype):
    if cpu_native.load() is None:
        pytest.skip("no C compiler: the native decode kernel is not built here")
    q, cache, meta = _decode_batch(q_dtype)
    assert cpu_native.supports(q, cache)
    out = torch.empty_like(q)
    cpu_native.paged_decode(q, cache, meta.block_tables, meta.seq_lens, 0.125, out)
    ref = torch_backend.paged_decode(q.float(), cache.float(), meta.block_tables, meta.seq_lens, 67, 0.125)
    torch.testing.assert_close(out.float(), ref, atol=1e-5 if q_dtype == torch.float32 else 1e-2, rtol=1e-2)


@pytest.fixture
def triton_interpreter():
    """Triton's CPU interpreter for one test, as tests/test_triton_attention.py sets it up and restores it."""
    from test_triton_attention import JIT_MODULES
    from triton_interp import interpreted

    with interpreted(JIT_MODULES):
        yield


def test_triton_store_into_an_fp8_cache_saturates_as_the_torch_store(triton_interpreter):
    from engine.model_executor.attention import triton_cache

    # fp8-exact values besides the out-of-range ones: the interpreter rounds other values its own way
    key = (50 * torch.randn(7, 2, 64)).to(FP8).float()
    key[1, 0, :3] = torch.tensor([1000.0, -1e6, float("inf")])
    value = torch.randn(7, 2, 64).to(FP8).float()
    cache, ref = torch.zeros(2, 6, 16, 2, 64, dtype=FP8), torch.zeros(2, 6, 16, 2, 64, dtype=FP8)
    slots = torch.tensor([-1, 3, 40, -1, 95, 16, -1])
    triton_cache.store_kvcache(key, value, cache, slots)
    torch_backend.reshape_and_cache(key, value, ref, slots)
    assert torch.equal(cache.view(torch.uint8), ref.view(torch.uint8))
    assert cache[0, 0, 3, 0, :3].float().tolist() == [448.0, -448.0, 448.0]


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_over_an_fp8_cache_matches_the_torch_backend(triton_interpreter, q_dtype):
    from engine.model_executor.attention import triton_backend

    g = torch.Generator().manual_seed(2)
    query_lens, seq_lens = [1, 1, 9, 12], [30, 4, 9, 45]
    tables = [[1, 2], [3], [4], [5, 6, 7]]
    meta = build_attn_metadata(query_lens, seq_lens, tables, 16, "cpu")
    cache = torch.randn(2, 8, 16, 2, 64, generator=g).to(FP8)
    q = torch.randn(sum(query_lens), 8, 64, generator=g).to(q_dtype)
    k, v = (torch.randn(sum(query_lens), 2, 64, generator=g).to(FP8).to(q_dtype) for _ in range(2))
    ref_cache = cache.clone()
    out = triton_backend.forward(q, k, v, cache, meta, 0.125)
    ref = torch_backend.forward(q, k, v, ref_cache, meta, 0.125)
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    tol = 1e-4 if q_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
