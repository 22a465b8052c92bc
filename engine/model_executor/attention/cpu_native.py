"""The CPU decode-attention kernel in C (csrc/paged_decode.c), built once with the system compiler.

Torch has no op that reads a paged cache in place; the torch path (cpu_decode) strings together a
sparse sampled matmul, a padded softmax and embedding_bag, and each writes and re-reads its scores
through memory. The C kernel reads every cache row of a context once per pass, with the whole query
group scored against it, and threads over (sequence, kv heads) items in torch's own OpenMP pool
(torch's bundled libgomp is already loaded under the soname the kernel asks for).

The build is `cc -O3 -march=native -fopenmp` (about a second) into a per-user cache, keyed by a hash
of the source, the compiler and its flags, and the CPU's feature flags; later start-ups only load it.
Without a compiler, or when the build or load fails, `load()` returns None and callers keep the
torch path. STEPSCOPE_NATIVE_KERNELS=0 turns the kernel off; STEPSCOPE_KERNEL_CACHE moves the cache.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
ABI_VERSION = 1
# Tried in order: with OpenMP threads, then single-threaded (OpenMP's simd pragmas only).
FLAG_SETS = (
    ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"),
    ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-shared", "-fPIC"),
)
BUILD_TIMEOUT_S = 60


def enabled() -> bool:
    return os.environ.get("STEPSCOPE_NATIVE_KERNELS", "1").lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    if "STEPSCOPE_KERNEL_CACHE" in os.environ:
        return Path(os.environ["STEPSCOPE_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stepscope" / "kernels"


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc; None when it is not on PATH."""
    return shutil.which(os.environ.get("CC", "cc"))


def _cpu_flags() -> str:
    """-march=native code runs only where the same instructions exist: the CPU's flags join the key."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _library_path(cc: str, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), " ".join(flags).encode(), platform.machine().encode(),
                 _cpu_flags().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"paged_decode-{key.hexdigest()[:20]}.so"


def _build(cc: str, flags: tuple[str, ...], target: Path) -> bool:
    """Compile into a temporary name beside `target`, then rename: concurrent builders never see half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            logger.info("native decode kernel: %s %s failed: %s", cc, " ".join(flags), proc.stderr.strip()[-500:])
            return False
        os.replace(tmp, target)
        return True
    except (OSError, subprocess.SubprocessError) as e:
        logger.info("native decode kernel: build failed: %s", e)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(path: Path) -> Callable[..., int] | None:
    try:
        lib = ctypes.CDLL(str(path))
        if lib.stepscope_paged_decode_abi() != ABI_VERSION:
            return None
    except (OSError, AttributeError) as e:
        logger.info("native decode kernel: cannot load %s: %s", path, e)
        return None
    fn = lib.stepscope_paged_decode_f32
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, p, p, p, i64, p, i32, i32, i32, i32, i32, i32, ctypes.c_float, p, i64, i32]
    fn.restype = i32
    return fn


@functools.cache
def load() -> Callable[..., int] | None:
    """The kernel's entry point, built on first use; None when it cannot be had here (see module doc)."""
    if not enabled():
        return None
    cc = compiler()
    if cc is None:
        logger.info("native decode kernel: no C compiler (%s), using the torch path", os.environ.get("CC", "cc"))
        return None
    for flags in FLAG_SETS:
        try:
            path = _library_path(cc, flags)
            if path.exists() or _build(cc, flags, path):
                fn = _bind(path)
                if fn is not None:
                    return fn
        except OSError as e:
            logger.info("native decode kernel: %s", e)
    return None


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """float32 on the CPU, and the kernel available."""
    return (kv_cache.device.type == "cpu" and kv_cache.dtype == torch.float32 and q.dtype == torch.float32
            and load() is not None)


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 scale: float, out: torch.Tensor) -> None:
    """Fill out [num_seqs, heads, d] with attention of q [num_seqs, heads, d] (one token per sequence)
    over each sequence's first seq_lens[i] cache positions, read through block_tables [>= num_seqs, W]."""
    fn = load()
    num_seqs, num_heads, head_size = q.shape
    _, _, block_size, num_kv_heads, cache_head_size = kv_cache.shape
    assert cache_head_size == head_size and num_heads % num_kv_heads == 0, (q.shape, kv_cache.shape)
    if num_seqs == 0:
        return
    if q.stride(2) != 1 or q.stride(1) != head_size:
        q = q.contiguous()
    assert out.stride(2) == 1 and out.stride(1) == head_size and out.shape == q.shape
    assert kv_cache.is_contiguous()
    tables = block_tables.to(torch.int32)
    if tables.stride(1) != 1:
        tables = tables.contiguous()
    lens = seq_lens[:num_seqs].to(torch.int32).contiguous()
    threads = torch.get_num_threads()
    # Whole sequences per item when there are enough to share out; else one kv head each, so a few long
    # contexts still keep every thread busy.
    per_item = num_kv_heads if num_seqs >= 4 * threads else 1
    rc = fn(q.data_ptr(), q.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), tables.data_ptr(),
            tables.stride(0), lens.data_ptr(), num_seqs, num_heads, num_kv_heads, head_size, block_size, per_item,
            scale, out.data_ptr(), out.stride(0), threads)
    if rc != 0:
        raise MemoryError("native decode kernel: could not allocate its work buffer")
