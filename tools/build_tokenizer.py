"""Trains the built-in byte-level BPE tokenizer on corpus.txt and writes it as a HF tokenizer directory.

Byte-level BPE means every UTF-8 byte has a token, so any text (Chinese, emoji) round-trips exactly.
Training is deterministic, so rerunning this gives a byte-identical tokenizer.json.
A build-time tool, not part of the runtime package. Run: python tools/build_tokenizer.py [out_dir]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
BUILTIN = Path(__file__).resolve().parents[1] / "engine" / "builtin"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def train_tokenizer(corpus: Path) -> Tokenizer:
    """Train on one file; special tokens come first so EOS gets id 0."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    return tok


def tokenizer_config() -> dict:
    """The transformers-side settings: a plain fast tokenizer whose EOS doubles as pad."""
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build(out_dir: Path = BUILTIN, corpus: Path = BUILTIN / "corpus.txt") -> Tokenizer:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"trained vocab has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config())
    _write_json(out_dir / "special_tokens_map.json", {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN,
                                                      "additional_special_tokens": SPECIAL_TOKENS[1:]})
    return tok


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else BUILTIN
    built = build(target)
    print(f"wrote {target} (vocab {built.get_vocab_size()}, eos id {built.token_to_id(EOS_TOKEN)})")
