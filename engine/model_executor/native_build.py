"""Building and loading the engine's C kernels for the CPU (attention/csrc, layers/csrc, sharing csrc/*.h).

Each source is built once with the system compiler (`cc -O3 -march=native -fopenmp`) into a per-user
cache, keyed by a hash of the source and the shared headers, the compiler and its flags, and the CPU's
feature flags; later start-ups only load it. The kernels run in torch's own OpenMP pool: torch's
bundled libgomp is already loaded under the soname they ask for. Without a compiler, or when the build or load fails,
`load_library` returns None and callers keep their torch path. STEPSCOPE_NATIVE_KERNELS=0 turns every
kernel off; STEPSCOPE_KERNEL_CACHE moves the cache.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

# Tried in order: with OpenMP threads, then single-threaded (OpenMP's simd pragmas only).
FLAG_SETS = (
    ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"),
    ("-O3", "-march=native", "-fno-math-errno", "-fopenmp-simd", "-shared", "-fPIC"),
)
BUILD_TIMEOUT_S = 60
# Headers the kernel sources include (e.g. csrc/exp_simd.h): part of every library's key.
SHARED_HEADERS = Path(__file__).with_name("csrc")


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


def library_path(source: Path, cc: str, flags: tuple[str, ...]) -> Path:
    key = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(SHARED_HEADERS.glob("*.h"))]
    for part in (source.read_bytes(), *headers, cc.encode(), " ".join(flags).encode(), platform.machine().encode(),
                 _cpu_flags().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"{source.stem}-{key.hexdigest()[:20]}.so"


def _build(source: Path, cc: str, flags: tuple[str, ...], target: Path) -> bool:
    """Compile into a temporary name beside `target`, then rename: concurrent builders never see half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *flags, "-o", tmp, str(source)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            logger.info("native kernel %s: %s %s failed: %s", source.name, cc, " ".join(flags),
                        proc.stderr.strip()[-500:])
            return False
        os.replace(tmp, target)
        return True
    except (OSError, subprocess.SubprocessError) as e:
        logger.info("native kernel %s: build failed: %s", source.name, e)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _open(path: Path, abi_symbol: str, abi_version: int) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(path))
        if getattr(lib, abi_symbol)() != abi_version:
            return None
    except (OSError, AttributeError) as e:
        logger.info("native kernel: cannot load %s: %s", path, e)
        return None
    return lib


def load_library(source: Path, abi_symbol: str, abi_version: int,
                 extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """`source` built (or found built) and loaded, its `abi_symbol()` checked; None where it cannot be had."""
    if not enabled():
        return None
    cc = compiler()
    if cc is None:
        logger.info("native kernel %s: no C compiler (%s), using the torch path", source.name,
                    os.environ.get("CC", "cc"))
        return None
    for base in FLAG_SETS:
        flags = (*base, *extra_flags)
        try:
            path = library_path(source, cc, flags)
            if path.exists() or _build(source, cc, flags, path):
                lib = _open(path, abi_symbol, abi_version)
                if lib is not None:
                    return lib
        except OSError as e:
            logger.info("native kernel %s: %s", source.name, e)
    return None
