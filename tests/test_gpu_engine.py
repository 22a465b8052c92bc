"""The engine on CUDA (run by bench/gpu_check.sh on a GPU machine; skipped elsewhere): greedy output
token-identical to transformers for each architecture, CUDA graphs equal to eager, bf16 presets run."""
import pytest
import torch
from transformers import GenerationConfig

from engine import LLM, SamplingParams
from test_engine_vs_hf import checkpoint, _prompts  # noqa: F401  (fixture re-used)

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def hf_greedy_cuda(hf, prompt, n=16):
    gen = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    model = hf.to("cuda")
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device="cuda"), generation_config=gen)
    hf.to("cpu")
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_greedy_matches_transformers_on_cuda(checkpoint, backend):  # noqa: F811
    path, hf = checkpoint
    prompts = _prompts(11, [5, 40, 17, 64, 1])
    llm = LLM(str(path), device="cuda", dtype="float32", max_model_len=256, kv_cache_memory=64 << 20,
              attention_backend=backend, max_num_batched_tokens=32)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy_cuda(hf, p) for p in prompts]


def test_cuda_graphs_give_the_same_tokens_as_eager(checkpoint):  # noqa: F811
    path, _ = checkpoint
    prompts = [{"prompt_token_ids": p} for p in _prompts(12, [9, 33, 70, 3, 21, 50, 8])]
    runs = []
    for eager in (True, False):
        llm = LLM(str(path), device="cuda", dtype="float32", max_model_len=256, kv_cache_memory=64 << 20,
                  attention_backend="triton", enforce_eager=eager, max_num_seqs=16)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)])
        if not eager:
            assert llm.llm_engine.engine_core.engine_core.executor.driver_worker.model_runner.graphs is not None
    assert runs[0] == runs[1]


def test_bf16_preset_with_dummy_weights_generates():
    llm = LLM("qwen3-0.6b", device="cuda", max_model_len=1024, max_num_seqs=32)
    outs = llm.generate([{"prompt_token_ids": list(range(100, 100 + n))} for n in (10, 200, 700)],
                        SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [20, 20, 20]


def test_kv_cache_is_sized_from_gpu_memory_utilization():
    small = LLM("qwen3-0.6b", device="cuda", max_model_len=1024, gpu_memory_utilization=0.3)
    n_small = small.llm_engine.engine_core.engine_core.kv_report.num_blocks
    del small
    torch.cuda.empty_cache()
    big = LLM("qwen3-0.6b", device="cuda", max_model_len=1024, gpu_memory_utilization=0.6)
    assert big.llm_engine.engine_core.engine_core.kv_report.num_blocks > 1.5 * n_small
