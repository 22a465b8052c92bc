"""`sim import-run`: a measured vLLM run as a trace directory, so `sim replay`, `sim compare` and the TUI
take a run nobody recorded with stepscope: LLMServingSim's run bundles (`vllm/meta.json` and vLLM's own
per-request stamps in `vllm/requests.jsonl`) and `vllm bench serve --save-result --save-detailed` files.

Such a run has per-request times but no steps or decisions, and records only the engine arguments it was
given: the rest of its scheduler and cache config is filled with that vLLM version's defaults, and
meta.json's `import` entry says which values were recorded and which inferred, and from where.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traces.outputs import Output, check_outputs
from traces.trace_dir import check_trace_output
from workloads.errors import WorkloadError
from workloads.importers import read_trace

if TYPE_CHECKING:
    import argparse

    from sim.fidelity.run_files import ImportedRun, RunRequest
    from workloads.importers import TraceRow

WRITE_BATCH = 512  # request rows per record batch: a batch of prompts stays a few MB


def _by_row(run: ImportedRun) -> Iterator[tuple[TraceRow, list[RunRequest]]]:
    """(workload TraceRow, the requests it served) in workload order: one pass over the workload, each
    prompt held only while its requests are written."""
    from sim.fidelity.run_files import WORKLOAD_FORMAT

    by_line: dict[int, list[RunRequest]] = {}
    for r in run.requests:
        by_line.setdefault(r.line, []).append(r)
    last = max(by_line)
    for index, row in enumerate(read_trace(run.workload, WORKLOAD_FORMAT)):
        if index in by_line:
            yield row, by_line.pop(index)
        if index >= last:
            break
    for line, missing in sorted(by_line.items()):
        r = missing[0]
        raise WorkloadError(*r.prompt_at, f"{r.request_id}: the workload {run.workload} has no row {line} "
                            f"(its rows are numbered from 0)")


def check_against_workload(run: ImportedRun) -> None:
    """Each request's workload row exists and holds as many prompt tokens as the run says, and no more
    output tokens came back than the row asked for (vLLM bench asks for its output_toks as max_tokens);
    arrivals and max_tokens come from the workload where the run has none. Read before anything is written."""
    for row, served in _by_row(run):
        for r in served:
            if row.prompt_tokens != r.num_prompt_tokens:
                raise WorkloadError(*r.prompt_at, f"{r.request_id} has {r.num_prompt_tokens} prompt tokens, but row "
                                    f"{r.line} of the workload {run.workload} has {row.prompt_tokens} input_tok_ids")
            if r.num_output_tokens > row.output_tokens:
                raise WorkloadError(*r.output_at, f"{r.request_id} has {r.num_output_tokens} output tokens, more "
                                    f"than the {row.output_tokens} row {r.line} of the workload {run.workload} "
                                    "asked for (output_toks)")
            if run.max_tokens_from_workload:
                r.max_tokens = row.output_tokens
            if run.arrivals_from_workload:
                r.arrival += row.arrival
                r.first_token = None if r.first_token is None else r.first_token + row.arrival
                r.finish = None if r.finish is None else r.finish + row.arrival


def _trace_rows(run: ImportedRun) -> Iterator[dict[str, Any]]:
    for row, served in _by_row(run):
        for r in served:
            yield {"request_id": r.request_id, "arrival": r.arrival, "queued": r.arrival,
                   "first_scheduled": r.first_scheduled, "first_token": r.first_token, "finish": r.finish,
                   "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_output_tokens,
                   "finish_reason": r.finish_reason, "priority": 0, "max_tokens": r.max_tokens, "error": r.error,
                   "prompt_token_ids": row.prompt_token_ids, "output_token_ids": []}


def write_trace(run: ImportedRun, out: Path, overwrite: bool = False) -> int:
    """The requests table through traces' own writer (no steps, decisions or block events: a measured
    run has none), replacing a trace in `out` only with `overwrite`; returns the number of requests written."""
    from sim.fidelity.run_files import WORKLOAD_FORMAT
    from traces.writer import TraceWriter

    meta = {**run.meta, "workload": {"name": run.workload.stem, "arrival": {"process": "trace",
                                                                           "format": WORKLOAD_FORMAT,
                                                                           "path": str(run.workload)}}}
    writer = TraceWriter(out, meta, flush_every=WRITE_BATCH, stream_format="arrow", overwrite=overwrite)
    n = 0
    batch: list[dict[str, Any]] = []
    for row in _trace_rows(run):
        batch.append(row)
        if len(batch) == WRITE_BATCH:
            writer.write_rows("requests", batch)
            writer.drain()
            n += len(batch)
            batch.clear()
    writer.write_rows("requests", batch)
    n += len(batch)
    writer.close(num_steps=0, interrupted=False)
    return n


def import_run_arguments(p: argparse.ArgumentParser) -> None:
    """`sim import-run`'s flags, on its subparser of `sim`."""
    p.add_argument("run", metavar="RUN_DIR|RESULT.json")
    p.add_argument("--workload", default=None, metavar="FILE.jsonl",
                   help="the workload the run served (llmservingsim JSONL: arrival_time_ns, input_tok_ids, "
                        "output_toks); default for a run bundle: its meta.json's dataset_path")
    p.add_argument("-o", "--output", required=True, metavar="TRACE_DIR", help="the trace directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace the trace in a non-empty TRACE_DIR")
    p.add_argument("--model-config", default=None, metavar="CONFIG.json",
                   help="the model's Hugging Face config.json: kept as config.model.hf_config (and its "
                        "max_position_embeddings as max_model_len when the run left it unset)")


def import_run(args: argparse.Namespace) -> int:
    """`sim import-run ...`; bad input raises, for `sim`'s one error path (one line, exit status 2)."""
    from sim.fidelity.run_files import MAX_META_BYTES, json_file, read_bench_result, read_llmservingsim_run

    out, src = Path(args.output), Path(args.run)
    check_trace_output(out, args.overwrite, [src, args.workload, args.model_config], flag="-o")
    hf_config = None
    if args.model_config is not None:
        hf_config = json_file(Path(args.model_config), MAX_META_BYTES, "model config")
        if not isinstance(hf_config, dict):
            raise WorkloadError(args.model_config, "(top level)", "expected a JSON object (a config.json)")
    if src.is_dir():
        run = read_llmservingsim_run(src, args.workload, hf_config)
    elif src.is_file():
        run = read_bench_result(src, args.workload)
        if hf_config is not None:
            run.meta["config"]["model"]["hf_config"] = hf_config
    else:
        raise ValueError(f"{src}: no such run directory or bench result file")
    check_against_workload(run)
    check_outputs([Output("-o", out, owns=True)], [run.workload])  # the workload a run bundle names itself
    n = write_trace(run, out, args.overwrite)
    entry = run.meta["import"]
    print(f"imported {n} requests from {src} (workload {run.workload}) into {out}")
    if entry["inferred"]:
        print(f"inferred: {', '.join(sorted(entry['inferred']))} (meta.json import.inferred says from where)")
    if entry["unknown"]:
        print(f"not recorded: {', '.join(sorted(entry['unknown']))} (meta.json import.unknown says why)")
    return 0
