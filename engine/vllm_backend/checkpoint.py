"""The built-in model written out as a Hugging Face checkpoint directory, so vLLM (which cannot take
stepscope's seeded dummy weights) loads exactly the weights stepscope's engine runs with."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def builtin_config() -> dict:
    """The built-in model's HF config: from the shared shape table where this stepscope has one,
    else from engine/builtin/config.json."""
    try:
        from engine.core.model_shapes import BUILTIN, get_model_config
    except ImportError:
        from engine.builtin import BUILTIN_DIR

        return json.loads((BUILTIN_DIR / "config.json").read_text())
    return dict(get_model_config(BUILTIN))


def write_builtin_config(path: str | Path) -> Path:
    """A directory holding the built-in model's config.json (all vLLM's ModelConfig needs to build a
    scheduler) and its tokenizer files."""
    from engine.builtin import BUILTIN_DIR

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(builtin_config(), indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(BUILTIN_DIR / name, out / name)
    return out


def save_builtin_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """config.json, model.safetensors (HF tensor names, merged projections split back) and tokenizer
    files of the built-in model with the engine's dummy weights for `seed`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from engine.model_executor.loader import load_model

    out = write_builtin_config(path)
    hf_config = AutoConfig.from_pretrained(out)
    model = load_model(hf_config, None, "dummy", torch.float32, "cpu", seed)
    inverse: dict[str, list[tuple[str, str | int]]] = {}
    for hf_name, (merged, shard) in model.stacked_params.items():
        inverse.setdefault(merged, []).append((hf_name, shard))
    tensors = {}
    for name, param in model.named_parameters():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in inverse:
            for hf_name, shard in inverse[parts[-2]]:
                start, size = model.shard_range(parts[-2], shard)
                tensors[".".join([*parts[:-2], hf_name, parts[-1]])] = param.data.narrow(0, start, size).clone()
        else:
            tensors[name] = param.data.clone().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
