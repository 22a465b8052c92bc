"""The three parts of an engine step that the calibrated model predicts separately, and their laws.

An engine step cycle is: host work before and after the model (schedule, sampling, applying outputs),
the model itself (`execute`: the device, or the CPU running the model), then the gap before the next step
starts (output processing, detokenization, request intake). Each part is a non-negative linear law in
the batch's shape. They are kept apart because async scheduling hides host time behind the next step's
execution while a synchronous engine pays all three in a row.
"""
from __future__ import annotations

import numpy as np

from sim.cost_models.batch import StepBatch

DEVICE_TERMS = ("c0", "c_p", "c_d", "c_ctx", "c_attn", "c_seq", "c_pseq")
HOST_TERMS = ("h0", "h_seq", "h_pseq", "h_tok")
GAP_TERMS = ("g0", "g_seq", "g_pseq")
PART_TERMS = {"device": DEVICE_TERMS, "host": HOST_TERMS, "gap": GAP_TERMS}
PARTS = tuple(PART_TERMS)
TERM_UNITS = {"c0": "step", "c_p": "prefill token", "c_d": "decode token", "c_ctx": "context token",
              "c_attn": "prefill attention pair", "c_seq": "sequence", "c_pseq": "prefill sequence", "h0": "step",
              "h_seq": "sequence", "h_pseq": "prefill sequence", "h_tok": "token", "g0": "step", "g_seq": "sequence",
              "g_pseq": "prefill sequence"}


def part_features(part: str, b: StepBatch) -> list[float]:
    """The regressors of one step for `part`, in PART_TERMS[part] order."""
    if part == "device":
        return [1.0, float(b.num_prefill_tokens), float(b.num_decode_tokens), float(b.context_tokens),
                float(b.prefill_attention), float(b.num_seqs), float(b.num_prefill_seqs)]
    if part == "host":
        return [1.0, float(b.num_seqs), float(b.num_prefill_seqs), float(b.num_tokens)]
    if part == "gap":
        return [1.0, float(b.num_seqs), float(b.num_prefill_seqs)]
    raise ValueError(f"unknown step part {part!r}")


def part_matrix(part: str, batches: list[StepBatch]) -> np.ndarray:
    return np.array([part_features(part, b) for b in batches], dtype=float).reshape(-1, len(PART_TERMS[part]))


# What the fitted range of a profile records, and how to read it off a batch.
RANGE_FIELDS = {"num_tokens": lambda b: b.num_tokens, "num_seqs": lambda b: b.num_seqs,
                "context_tokens": lambda b: b.context_tokens, "num_prefill_tokens": lambda b: b.num_prefill_tokens}


def batch_range(batches: list[StepBatch]) -> dict[str, int]:
    """The largest value of each shape field among `batches` (the profile's domain of validity)."""
    return {k: int(max((f(b) for b in batches), default=0)) for k, f in RANGE_FIELDS.items()}
