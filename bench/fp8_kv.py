"""What `--kv-cache-dtype fp8` costs in tokens and buys in KV blocks, on this machine's CPU.

Greedy decoding of the same prompts with the model's own cache dtype and with an fp8 cache, on a bench
model of bench/cpu_cases.py (random weights, the built-in tokenizer):
- next-token agreement: fp8's greedy choice given each prefix of the reference run's output (teacher-forced:
  a flip does not carry into the positions after it);
- free-running agreement: the two greedy runs position by position (one flip changes the rest of its
  sequence, so on a random model's near-tied logits this is much the lower);
- KV blocks the same --kv-cache-memory holds, model dtype vs fp8, and `ratio:` fp8 / model dtype.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hidden-128", help="a bench shape of bench/cpu_cases.py, or a checkpoint dir")
    p.add_argument("--dtype", default="auto", help="model dtype (auto: float32 on a CPU)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-cache-memory", type=int, default=16 << 20)
    a = p.parse_args()

    import torch

    from cpu_cases import SHAPES, checkpoint_for
    from engine import LLM, SamplingParams

    path = checkpoint_for(a.model) if a.model in SHAPES else Path(a.model)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 64, (a.prompts,), generator=g)]
    engines = {kv: LLM(str(path), device="cpu", dtype=a.dtype, kv_cache_memory=a.kv_cache_memory, max_model_len=256,
                       max_num_seqs=a.prompts * a.max_tokens, kv_cache_dtype=kv, skip_tokenizer_init=True)
               for kv in ("auto", "fp8")}

    def greedy(kv: str, batch: list[list[int]], n: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        outs = engines[kv].generate([{"prompt_token_ids": q} for q in batch], params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

    t0 = time.perf_counter()
    ref, fp8 = greedy("auto", prompts, a.max_tokens), greedy("fp8", prompts, a.max_tokens)
    total = a.prompts * a.max_tokens
    free = sum(x == y for r, f in zip(ref, fp8) for x, y in zip(r, f)) / total
    contexts = [q + r[:i] for q, r in zip(prompts, ref) for i in range(a.max_tokens)]
    forced = sum(c[0] == t for c, t in zip(greedy("fp8", contexts, 1), (t for r in ref for t in r))) / total
    blocks = {kv: llm.llm_engine.engine_core.engine_core.kv_report.num_blocks for kv, llm in engines.items()}
    dtype = engines["auto"].llm_engine.engine_core.engine_core.config.model_config.dtype
    print(f"model {path.name}, dtype {dtype}, {a.prompts} prompts x {a.max_tokens} greedy tokens, "
          f"KV cache {a.kv_cache_memory / 2**20:.0f} MiB, {time.perf_counter() - t0:.1f} s")
    print(f"next-token agreement: {forced:.3f} fraction of {total} tokens")
    print(f"free-running agreement: {free:.3f} fraction of {total} tokens")
    print(f"kv blocks {dtype}: {blocks['auto']} blocks")
    print(f"kv blocks fp8: {blocks['fp8']} blocks")
    print(f"ratio: {blocks['fp8'] / blocks['auto']:.3f}")


if __name__ == "__main__":
    main()
