"""Measure the kernels our engine runs for a model on this GPU, and write them as a kernel-profile bundle
(the layout `sim replay --cost-model BUNDLE_DIR` reads: meta.yaml, tp1/dense.csv, attention.csv,
per_sequence.csv), so a user can profile their own GPU and the simulator prices steps from it.

Each op is the engine's own module (projections as nn.Linear, RMSNorm with the fused residual add,
rotary, SiluAndMul, the paged attention backend over a real block table, the LM head, greedy sampling)
at the model's shapes in bf16, timed with CUDA events: warm-up, then the median of `--repeats` timings
of `--iters` back-to-back calls each.

    python bench/gpu_profile.py --model qwen3-0.6b --out profiles/h200/qwen3-0.6b [--quick]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.model_shapes import MODEL_CONFIGS  # noqa: E402
from sim.cost_models.model_shape import model_shape, read_config_json  # noqa: E402

TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192]
SEQUENCES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
CHUNKS = [0, 16, 64, 256, 1024, 2048]
KV_PREFILL = [0, 512, 2048, 8192]
DECODES = [0, 1, 4, 16, 64, 256]
KV_DECODE = [16, 128, 512, 2048, 8192, 16384]
BLOCK = 16


class Timer:
    """Median seconds of one call. On CUDA the calls are captured in a CUDA graph and the graph replayed,
    as the engine replays its decode steps, so host-side launch costs are not counted as kernel time
    (eager timing where capture fails, counted in `eager`); on a CPU smoke run, the wall clock."""

    def __init__(self, device: torch.device, iters: int, repeats: int) -> None:
        self.device, self.iters, self.repeats = device, iters, repeats
        self.eager = 0

    def _graph(self, fn: Callable[[], object]) -> Callable[[], object] | None:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(self.iters):
                    fn()
            return graph.replay
        except RuntimeError:
            torch.cuda.synchronize()
            return None

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(2):
            fn()
        times = []
        if self.device.type == "cuda":
            replay = self._graph(fn)
            calls = 1 if replay is not None else self.iters
            if replay is None:
                self.eager += 1
                replay = fn
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(calls):
                    replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3 / self.iters)
            return statistics.median(times)
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            for _ in range(self.iters):
                fn()
            times.append((time.perf_counter() - t0) / self.iters)
        return statistics.median(times)


def dense_ops(shape, cfg: dict, device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[int], Callable]]:
    """For each op, a factory: tokens -> a closure running the engine's module on fresh inputs."""
    from torch import nn

    from engine.model_executor.layers.activation import SiluAndMul
    from engine.model_executor.layers.layernorm import RMSNorm
    from engine.model_executor.layers.rotary_embedding import RotaryEmbedding, rope_params_from_config

    h, q, kv, i = shape.hidden, shape.q_size, shape.kv_size, shape.intermediate

    def linear(n_in: int, n_out: int, bias: bool = False) -> nn.Linear:
        return nn.Linear(n_in, n_out, bias=bias, device=device, dtype=dtype)

    mods = {"qkv_proj": linear(h, q + 2 * kv, shape.qkv_bias), "o_proj": linear(q, h),
            "gate_up_proj": linear(h, 2 * i), "down_proj": linear(i, h)}
    norm, head_norm = RMSNorm(h).to(device, dtype), RMSNorm(shape.head_dim).to(device, dtype)
    base, scaling = rope_params_from_config(type("C", (), cfg)())
    rope = RotaryEmbedding(shape.head_dim, shape.head_dim, 32768, base, scaling).to(device)
    act, emb = SiluAndMul(), nn.Embedding(shape.vocab, h, device=device, dtype=dtype)

    def x(t: int, n: int) -> torch.Tensor:
        return torch.randn(t, n, device=device, dtype=dtype)

    def bind(fn: Callable, *args: object) -> Callable[[], object]:
        return lambda: fn(*args)

    def fused_norm(t: int) -> Callable[[], object]:
        a, r = x(t, h), x(t, h)
        return lambda: norm(a.clone(), r)

    heads = shape.num_heads + shape.num_kv_heads
    ops: dict[str, Callable[[int], Callable]] = {
        name: (lambda t, m=m: bind(m, x(t, m.in_features))) for name, m in mods.items()}
    ops["layernorm"] = ops["final_layernorm"] = fused_norm
    ops["rotary_emb"] = lambda t: bind(rope, torch.arange(t, device=device) % 32768, x(t, q), x(t, kv))
    if shape.qk_norm:
        ops["qk_norm"] = lambda t: bind(head_norm, torch.randn(t, heads, shape.head_dim, device=device, dtype=dtype))
    ops["act_fn"] = lambda t: bind(act, x(t, 2 * i))
    ops["embedding"] = lambda t: bind(emb, torch.randint(0, shape.vocab, (t,), device=device))
    return ops


def attention_call(shape, device: torch.device, dtype: torch.dtype, backend, pc: int, kvp: int, nd: int,
                   kvd: int) -> Callable[[], object]:
    """One attention call of a mixed batch: `nd` decodes over `kvd` tokens each, then one prefill chunk of
    `pc` tokens after `kvp` cached ones, through the backend's paged forward with real block tables."""
    from engine.model_executor.forward_context import AttentionMetadata

    lens = [kvd] * nd + ([kvp + pc] if pc else [])
    queries = [1] * nd + ([pc] if pc else [])
    blocks_per_seq = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(blocks_per_seq) + 1
    cache = torch.zeros(backend.get_kv_cache_shape(num_blocks, BLOCK, shape.num_kv_heads, shape.head_dim),
                        device=device, dtype=dtype)
    width = max(blocks_per_seq)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    slots, nxt = [], 1
    for row, (n, q) in enumerate(zip(lens, queries)):
        ids = list(range(nxt, nxt + blocks_per_seq[row]))
        nxt += len(ids)
        table[row, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        slots += [ids[p // BLOCK] * BLOCK + p % BLOCK for p in range(n - q, n)]
    starts = [0]
    for q in queries:
        starts.append(starts[-1] + q)
    t = starts[-1]
    meta = AttentionMetadata(
        num_actual_tokens=t, slot_mapping=torch.tensor(slots, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), block_tables=table.to(device),
        max_query_len=max(queries), max_seq_len=max(lens), num_decodes=nd, num_decode_tokens=nd,
        query_start_loc_cpu=starts, seq_lens_cpu=lens)
    qt = torch.randn(t, shape.num_heads, shape.head_dim, device=device, dtype=dtype)
    kt = torch.randn(t, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype)
    vt = torch.randn_like(kt)
    return lambda: backend.forward(qt, kt, vt, cache, meta, shape.head_dim ** -0.5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-0.6b", help="a preset or config.json")
    p.add_argument("--out", required=True, type=Path, help="the bundle directory to write (must not exist)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a coarse grid (a smoke run)")
    args = p.parse_args()
    if args.out.exists():
        print(f"gpu_profile: {args.out} exists; choose a new directory", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_profile: no CUDA device", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    shape = model_shape(args.model)
    cfg = MODEL_CONFIGS.get(args.model) or read_config_json(Path(args.model) if Path(args.model).is_file()
                                                            else Path(args.model) / "config.json")
    if device.type == "cuda":
        from engine.model_executor.attention.triton_backend import TritonAttentionBackend as backend
    else:
        from engine.model_executor.attention.torch_backend import TorchAttentionBackend as backend
    tokens, seqs = (TOKENS[::4], SEQUENCES[::3]) if args.quick else (TOKENS, SEQUENCES)
    chunks, kvps, decodes, kvds = ((CHUNKS[::2], KV_PREFILL[::2], DECODES[::2], KV_DECODE[::2]) if args.quick
                                   else (CHUNKS, KV_PREFILL, DECODES, KV_DECODE))
    timer = Timer(device, args.iters, args.repeats)
    t0 = time.perf_counter()
    out = args.out / "tp1"
    out.mkdir(parents=True)
    with torch.inference_mode():
        with (out / "dense.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["layer", "tokens", "time_us"])
            for name, make in dense_ops(shape, cfg, device, dtype).items():
                for t in tokens:
                    w.writerow([name, t, f"{timer(make(t)) * 1e6:.3f}"])
        with (out / "per_sequence.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["layer", "sequences", "time_us"])
            head = torch.nn.Linear(shape.hidden, shape.vocab, bias=False, device=device, dtype=dtype)
            for n in seqs:
                hidden = torch.randn(n, shape.hidden, device=device, dtype=dtype)
                w.writerow(["lm_head", n, f"{timer(functools.partial(head, hidden)) * 1e6:.3f}"])
                logits = torch.randn(n, shape.vocab, device=device, dtype=torch.float32)
                w.writerow(["sampler", n, f"{timer(functools.partial(torch.argmax, logits, dim=-1)) * 1e6:.3f}"])
        n_att = 0
        with (out / "attention.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])
            for pc in chunks:
                for kvp in (kvps if pc else [0]):
                    for nd in decodes:
                        for kvd in (kvds if nd else [0]):
                            if not pc and not nd:
                                continue
                            call = attention_call(shape, device, dtype, backend, pc, kvp, nd, kvd)
                            w.writerow([pc, kvp, nd, kvd, f"{timer(call) * 1e6:.3f}"])
                            n_att += 1
                            del call
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"profiler": "stepscope bench/gpu_profile.py", "gpu": name,
            "hardware": name.replace("NVIDIA ", "").split(" ")[0], "model": args.model,
            "architecture": shape.model_type, "variant": "bf16", "tp_degrees": [1],
            "profiled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch_version": str(torch.__version__), "cuda_version": str(torch.version.cuda),
            "engine_effective": {"enforce_eager": False, "cuda_graphs": device.type == "cuda",
                                 "attention_backend": backend.name, "block_size": BLOCK},
            "measurement": {"iterations": args.iters, "repeats": args.repeats, "statistic": "median",
                            "timed_eagerly": timer.eager}}
    (args.out / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    print(f"gpu: {name}")
    print(f"attention shapes measured: {n_att}")
    print(f"kernels timed eagerly (graph capture failed): {timer.eager}")
    print(f"profile time: {time.perf_counter() - t0:.1f} s")
    print(f"bundle: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
