"""Offline throughput in nano-vllm's shape: N sequences with random input and output lengths,
ignore_eos, for this engine and for transformers' batched (left-padded) `generate` on the same model
shape; vLLM too when it is importable. Prints `label: value unit` lines and `ratio: engine / transformers`.

    python bench/throughput.py                       # CPU defaults: built-in model, 64 requests
    python bench/throughput.py --device cuda --model qwen3-0.6b --num-seqs 256 --min-len 100 --max-len 1024
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402


def make_requests(n: int, lo: int, hi: int, out_lo: int, out_hi: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab - 1, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    outs = [int(x) for x in torch.randint(out_lo, out_hi + 1, (n,), generator=g)]
    return prompts, outs


def bench_engine(args, prompts, outs) -> float:
    from engine import LLM, SamplingParams

    llm = LLM(args.model, device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
              num_threads=args.threads, enforce_eager=args.enforce_eager)
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for o in outs]
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4), use_tqdm=False)
    runs = []
    for _ in range(args.repeats):
        llm.reset_prefix_cache()  # repeats must not hit the previous repeat's prompts
        t = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        runs.append(sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t))
    return statistics.median(runs)


def bench_transformers(args, prompts, outs, hf_config) -> float:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype).to(args.device).eval()
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as batched generation needs
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(args.device), mask.to(args.device)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(outs), min_new_tokens=max(outs),
                           do_sample=False, pad_token_id=0)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        # Every sequence runs to the longest output; only each request's own tokens count as useful.
        runs.append(sum(outs) / (time.perf_counter() - t))
    return statistics.median(runs)


def bench_vllm(args, prompts, outs) -> float | None:
    try:
        from vllm import LLM as VLLM, SamplingParams as VParams
    except ImportError:
        return None
    llm = VLLM(args.vllm_model or args.model, load_format="dummy", max_model_len=args.max_model_len,
               enforce_eager=args.enforce_eager)
    params = [VParams(max_tokens=o, temperature=0.0, ignore_eos=True) for o in outs]
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return sum(outs) / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="preset, checkpoint dir, or none for the built-in model")
    p.add_argument("--vllm-model", default=None, help="HF id or dir for vLLM (needs the model's config)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--min-out", type=int, default=16)
    p.add_argument("--max-out", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--skip-transformers", action="store_true")
    args = p.parse_args()
    from engine.config import EngineArgs

    hf_config = EngineArgs(model=args.model, device=args.device).create_engine_config().model_config.hf_config
    prompts, outs = make_requests(args.num_seqs, args.min_len, args.max_len, args.min_out, args.max_out,
                                  hf_config.vocab_size)
    print(f"requests: {len(prompts)} prompts {args.min_len}-{args.max_len} tokens, outputs {args.min_out}-{args.max_out}",
          flush=True)
    ours = bench_engine(args, prompts, outs)
    print(f"threads: {torch.get_num_threads()} of {os.cpu_count()} cpus", flush=True)
    print(f"engine: {ours:.1f} tok/s", flush=True)
    if not args.skip_transformers:
        theirs = bench_transformers(args, prompts, outs, hf_config)
        print(f"transformers: {theirs:.1f} tok/s", flush=True)
        print(f"ratio: {ours / theirs:.2f}")
    vllm = bench_vllm(args, prompts, outs)
    if vllm is not None:
        print(f"vllm: {vllm:.1f} tok/s")
        print(f"ratio_vs_vllm: {ours / vllm:.2f}")


if __name__ == "__main__":
    main()
