"""Build a model straight on its device and fill it from safetensors or from seeded dummy values."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from engine.model_executor.models.llama import LlamaForCausalLM, head_dim_of
from engine.model_executor.models.registry import get_model_class, resolve_architecture

LOAD_FORMATS = ("safetensors", "dummy")


@dataclass(slots=True, frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_size: int


def kv_cache_spec(hf_config: Any) -> KVCacheSpec:
    """The shape facts the runner needs to size and allocate the paged KV cache."""
    return KVCacheSpec(
        num_layers=hf_config.num_hidden_layers,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
        head_size=head_dim_of(hf_config),
    )


def kv_bytes_per_block(spec: KVCacheSpec, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id costs across all layers (K and V), i.e. GPU memory per block in the pool."""
    return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_size * dtype.itemsize


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


@contextmanager
def _skip_default_init() -> Iterator[None]:
    """Leave parameters uninitialised while building: the checkpoint or dummy init overwrites them anyway,
    and torch's default init would spend minutes on CPU for a multi-billion-parameter model."""
    names = ("kaiming_uniform_", "uniform_", "normal_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def build_model(
    hf_config: Any, dtype: torch.dtype, device: torch.device | str, attn_backend: str = "auto"
) -> LlamaForCausalLM:
    """Instantiate the architecture with parameters allocated, uninitialised, directly on `device`.

    "meta" allocates nothing, which is how parameter counts are taken without materialising weights.
    """
    cls = get_model_class(resolve_architecture(hf_config))
    with _default_dtype(dtype), torch.device(device), _skip_default_init():
        model = cls(hf_config, attn_backend=attn_backend)
    return model.eval()


def safetensors_files(model_dir: str | Path | None) -> list[Path]:
    """The checkpoint files of `model_dir`: the shards its index lists, or the single model.safetensors."""
    if model_dir is None:
        raise ValueError("load_format 'safetensors' needs a model directory, got None")
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {str(root)!r} does not exist")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = [_shard_path(root, index, name) for name in sorted(set(_weight_map(index).values()), key=str)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        _check_inside(root, single, f"{single}: resolves to {single.resolve()}")
        return [single]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {str(root)!r}")


def _weight_map(index: Path) -> dict[str, Any]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{index}: not a JSON file ({e})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: needs a 'weight_map' object of tensor name -> shard file name")
    return weight_map


def _shard_path(root: Path, index: Path, name: Any) -> Path:
    """A shard named by the index must be a file of the model directory: a name from outside must not
    make the loader open arbitrary files."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{index}: shard {name!r} is not a file name")
    rel = Path(name)
    if rel.is_absolute():
        raise ValueError(f"{index}: shard {name!r} is an absolute path; shards must lie inside {root}")
    if ".." in rel.parts:
        raise ValueError(f"{index}: shard {name!r} climbs out of the model directory with '..'")
    path = root / rel
    _check_inside(root, path, f"{index}: shard {name!r} is a symlink to {path.resolve()}")
    return path


def _check_inside(root: Path, path: Path, what: str) -> None:
    """Symlinks may point within the model directory, or (a Hugging Face cache snapshot,
    snapshots/<rev>/ -> ../../blobs/) into the same repository's blobs; nowhere else."""
    real = path.resolve()
    allowed = [root.resolve()]
    if root.resolve().parent.name == "snapshots":
        allowed.append(root.resolve().parent.parent / "blobs")
    if not any(real.is_relative_to(a) for a in allowed):
        raise ValueError(f"{what}, outside the model directory {root}")


def iter_safetensors(files: Iterable[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs one at a time, so only one tensor is held on the host at once. A tensor
    holding NaN or infinity is refused here: such weights would generate empty text that looks finished."""
    for path in files:
        try:
            f = safe_open(str(path), framework="pt", device="cpu")
        except SafetensorError as e:
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
        with f:
            for name in f.keys():
                try:
                    tensor = f.get_tensor(name)
                except SafetensorError as e:
                    raise ValueError(f"{path}: weight {name} cannot be read ({e}); the file may be cut short") from None
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise ValueError(f"{path}: weight {name} holds NaN or infinite values")
                yield name, tensor


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Seeded normal(0, std) weights and unit norms; fixed order and generator make it repeatable per device."""
    params = list(model.named_parameters())
    if not params or params[0][1].device.type == "meta":
        return
    gen = torch.Generator(device=params[0][1].device).manual_seed(seed)
    for name, param in params:
        if param.dim() == 1 and "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(mean=0.0, std=std, generator=gen)


def load_model(
    hf_config: Any,
    model_dir: str | Path | None,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    *,
    attn_backend: str = "auto",
) -> LlamaForCausalLM:
    """A ready-to-run model in eval mode; checkpoint problems are reported before any weight is allocated."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; valid: {', '.join(LOAD_FORMATS)}")
    files = safetensors_files(model_dir) if load_format == "safetensors" else []
    model = build_model(hf_config, dtype, torch.device(device), attn_backend)
    if load_format == "dummy":
        init_dummy_weights(model, seed)
        return model
    loaded = model.load_weights(iter_safetensors(files))
    missing = sorted(set(dict(model.named_parameters())) - loaded)
    if missing:
        raise ValueError(f"checkpoint in {str(model_dir)!r} lacks {len(missing)} weights, e.g. {missing[:5]}")
    return model
