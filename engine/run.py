"""`engine run`: build the engine with a trace, drive it with the workload (engine.workload_driver),
print a summary."""
from __future__ import annotations

import tempfile
from pathlib import Path

from engine.workload_driver import CPU_SCALE, run_workload
from traces.trace_dir import check_trace_output
from workloads import DEFAULT_WORKLOAD
from workloads.workload import check_time_scale


def model_inputs(args) -> list[str]:
    """The files a run reads besides its workload: the model and tokenizer, where they are paths."""
    return [p for p in (args.model, args.tokenizer) if p is not None and Path(p).exists()]


def main_run(args) -> int:
    """Entry for the CLI: build the engine with a trace (a temporary one if --trace is absent)."""
    from engine.config import EngineArgs
    from traces.summary import trace_summary
    from workloads import load_workload

    check_time_scale(args.time_scale)
    if args.max_requests is not None and args.max_requests < 1:
        raise ValueError(f"--max-requests: must be >= 1, got {args.max_requests}")
    workload_path = Path(args.workload) if args.workload else DEFAULT_WORKLOAD
    if args.trace is not None:  # before the model loads: refused in a second, not after a minute
        check_trace_output(args.trace, args.overwrite, [workload_path, *model_inputs(args)])
    workload = load_workload(workload_path)
    if getattr(args, "backend", "stepscope") == "vllm":
        from engine.vllm_backend.runner import main_run_vllm

        return main_run_vllm(args, workload)
    from engine.llm_engine import LLMEngine  # after the cheap checks: it loads torch and transformers

    engine_args = EngineArgs.from_cli_args(args)
    tmp = None
    if engine_args.trace is None:
        tmp = tempfile.TemporaryDirectory(prefix="stepscope-run-")
        engine_args.trace = tmp.name
    config = engine_args.create_engine_config()
    if args.workload is None and config.device_config.device == "cpu":
        workload = workload.scaled(**CPU_SCALE)
    engine = LLMEngine(config)
    engine.engine_core.update_trace_meta(workload={**workload.to_dict(), "time_scale": args.time_scale,
                                                   "max_requests": args.max_requests})
    try:
        result = run_workload(engine, workload, args.time_scale, args.max_requests, progress=not args.no_progress)
    except BaseException:  # a trace the disk stopped taking: close what is left, then say why
        engine.shutdown(interrupted=True)
        raise
    engine.shutdown(interrupted=result.interrupted)
    print(trace_summary(config.observability_config.trace_dir))
    if tmp is None:
        print(f"trace: {config.observability_config.trace_dir}")
    else:
        tmp.cleanup()
    return 130 if result.interrupted else 0
