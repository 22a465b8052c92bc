"""Loads a model directory's tokenizer, offline and fast-only (incremental detokenization needs the
Rust backend's DecodeStream)."""
from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def get_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load the tokenizer in `path` without touching the hub or asking on stdin (a tokenizer whose
    config names its own code needs `trust_remote_code`); raise ValueError if there is none."""
    path = Path(path)
    if not path.is_dir() or not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ValueError(f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in directory {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True,
                                                  trust_remote_code=trust_remote_code)
    except Exception as e:  # the Rust tokenizer raises plain Exceptions for a file it cannot parse
        raise ValueError(f"{path}: its tokenizer cannot be loaded ({' '.join(str(e).split())})") from None
    if not tokenizer.is_fast:
        raise ValueError(f"tokenizer in {path} is not a fast (Rust) tokenizer")
    return tokenizer
