"""The built-in demo model: used when no --model is given.

It is a real Qwen3 architecture (its shape is engine.core.model_shapes' "builtin", shared with the
simulator) with a real byte-level BPE tokenizer trained on our own corpus, but it ships NO weights: the loader fills them with deterministic random values, so its text is
gibberish. It exists so the engine runs end to end, offline, on any machine, with realistic shapes.
"""
from pathlib import Path

BUILTIN_DIR: Path = Path(__file__).resolve().parent
