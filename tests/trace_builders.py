"""Pieces several test modules share to build what they check: scheduler runs fed to a trace recorder,
workload specs, a traced CLI run ended by a signal, and tiny random Hugging Face checkpoints."""
from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core_helpers import fake_output, make_requests
from recording import record_step

import traces
from engine.core import Request, Scheduler
from traces.recorder import TraceRecorder


def steps_as_requests_arrive(sched: Scheduler, rec: TraceRecorder, pending: list[Request],
                             now: list[float]) -> Iterator[int]:
    """Yields step numbers 0, 1, ... each time a step is due, until `pending` (in arrival order) is empty
    and every request has finished. Before each step, hands the scheduler and the recorder every request
    whose arrival the clock `now[0]` has reached; with nothing to run, jumps the clock to the next arrival.
    The caller runs the step and moves the clock past it."""
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0].arrival_time <= now[0]:
            req = pending.pop(0)
            sched.add_request(req)
            rec.on_add(req)
        if not sched.has_unfinished_requests():
            now[0] = pending[0].arrival_time
            continue
        yield step
        step += 1


def prefix_and_short_requests() -> list[Request]:
    """Three 14-token prompts sharing an 8-token prefix (12 output tokens), then three 6-token prompts
    (9 output tokens), all ignoring EOS."""
    return (make_requests(3, num_tokens=14, max_tokens=12, ignore_eos=True, prefix=list(range(500, 508)))
            + make_requests(3, num_tokens=6, max_tokens=9, ignore_eos=True, start=3))


def record_adding_every_other_step(sched: Scheduler, rec: TraceRecorder, pending: list[Request],
                                   num_steps: int | None = None) -> Iterator[int]:
    """Runs `sched` with a fake model runner, adding the next of `pending` on every even step, and records
    step k as lasting from k to k + 0.5 s; yields each step's number once it is recorded. Stops when every
    request has finished, or after `num_steps` steps."""
    step = 0
    while (sched.has_unfinished_requests() or pending) and step != num_steps:
        if pending and step % 2 == 0:
            req = pending.pop(0)
            sched.add_request(req)
            rec.on_add(req)
        out = sched.schedule()
        record_step(rec, out, sched.update_from_output(out, fake_output(out, sched)), float(step), step + 0.5)
        yield step
        step += 1


def prefix_sharing_workload(name: str, arrival: dict, num_requests: int, max_prompt: int,
                            prefix_tokens: int) -> dict[str, Any]:
    """A workload spec: prompts of 20 to `max_prompt` tokens, 6 to 20 output tokens, and 70% of the
    requests opening with one of two shared prefixes of `prefix_tokens` tokens."""
    return {
        "name": name, "seed": 5, "num_requests": num_requests, "arrival": arrival,
        "prompt_tokens": {"dist": "uniform", "min": 20, "max": max_prompt},
        "output_tokens": {"dist": "uniform", "min": 6, "max": 20},
        "prefix": {"groups": 2, "tokens": prefix_tokens, "fraction": 0.7},
    }


def interrupt_traced_run(proc: subprocess.Popen, sig: signal.Signals, trace_dir: Path,
                         exit_status: int) -> traces.Trace:
    """Sends `sig` to a running traced command and loads the trace it leaves, asserting that it exited
    with `exit_status` and no traceback, and that the trace is complete, compacted and marked interrupted."""
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == exit_status, stderr
    assert "Traceback" not in stderr
    t = traces.load(trace_dir)
    assert t.complete and t.meta["interrupted"] is True
    assert (trace_dir / "steps.parquet").exists()
    return t


def save_random_hf_model(model_cls, config, path: Path, weight_scale: float):
    """A Hugging Face model of `model_cls` with seeded random weights: norm weights near 1, every other
    weight of about `weight_scale`, so that logits are far from the init's near-ties; saved as
    safetensors under `path` and returned in eval mode."""
    import torch

    torch.manual_seed(0)
    config._attn_implementation = "eager"
    hf = model_cls(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else weight_scale * torch.randn_like(p))
    hf.save_pretrained(path)
    return hf
