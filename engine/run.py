"""`engine run`: build the engine with a trace, drive it with the workload (engine.workload_driver),
print a summary."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from traces.console import trace_line
from traces.trace_dir import check_trace_output
from workloads import DEFAULT_WORKLOAD


def model_inputs(args) -> list[str]:
    """The files a run reads besides its workload: the model and tokenizer, where they are paths."""
    return [p for p in (args.model, args.tokenizer) if p is not None and Path(p).exists()]


def cpu_default_sizes(engine_args) -> None:
    """The default run on a CPU: its context cut like its workload, and a KV cache that holds one longest
    sequence (the least the engine takes), each where no flag sets it."""
    from engine.workload_driver import CPU_MAX_MODEL_LEN

    if engine_args.max_model_len is None:
        engine_args.max_model_len = CPU_MAX_MODEL_LEN
    if engine_args.num_gpu_blocks_override is None and engine_args.kv_cache_memory is None:
        engine_args.num_gpu_blocks_override = -(-engine_args.max_model_len // engine_args.block_size) + 1  # + null


def main_run(args) -> int:
    """Entry for the CLI: build the engine with a trace (a temporary one if --trace is absent)."""
    workload_path = Path(args.workload) if args.workload else DEFAULT_WORKLOAD
    if args.trace is not None:  # before anything heavy loads: an existing trace is refused at once
        check_trace_output(args.trace, args.overwrite, [workload_path, *model_inputs(args)])
    from engine.config import EngineArgs, bound_openmp_spin, resolve_device
    from engine.workload_driver import CPU_SCALE, run_workload
    from traces.summary import trace_summary
    from workloads.flags import workload_options
    from workloads.workload import load_workload

    workload_options(args, "engine run")
    workload = load_workload(workload_path)
    if args.backend == "vllm":
        from engine.vllm_backend.runner import main_run_vllm

        return main_run_vllm(args, workload)
    bound_openmp_spin()  # before resolve_device loads torch, which starts its OpenMP runtime
    from engine.llm_engine import LLMEngine  # after the cheap checks: it loads torch and transformers

    engine_args = EngineArgs.from_cli_args(args)
    tmp = None
    if engine_args.trace is None:
        tmp = tempfile.TemporaryDirectory(prefix="stepscope-run-")
        engine_args.trace = tmp.name
    if args.workload is None and resolve_device(engine_args.device) == "cpu":
        workload = workload.scaled(**CPU_SCALE)
        cpu_default_sizes(engine_args)
        logging.getLogger(__name__).info(
            "default run on a CPU: %s cut to %d requests and %g of the lengths, max_model_len %d, KV cache %s "
            "(--workload, --max-model-len, --num-gpu-blocks-override or --kv-cache-memory change them)",
            workload_path.name, CPU_SCALE["num_requests"], CPU_SCALE["length_factor"], engine_args.max_model_len,
            f"{engine_args.num_gpu_blocks_override} blocks" if engine_args.num_gpu_blocks_override
            else f"{engine_args.kv_cache_memory} bytes")
    config = engine_args.create_engine_config()
    engine = LLMEngine(config)
    engine.engine_core.update_trace_meta(workload={**workload.to_dict(), "time_scale": args.time_scale,
                                                   "max_requests": args.max_requests})
    try:
        result = run_workload(engine, workload, args.time_scale, args.max_requests, progress=not args.no_progress)
    except BaseException:  # a trace the disk stopped taking: close what is left, then say why
        engine.shutdown(interrupted=True)
        raise
    engine.shutdown(interrupted=result.interrupted)
    trace_dir = config.observability_config.trace_dir
    if trace_dir is None:
        raise RuntimeError("engine run: the engine was built without its trace directory")
    print(trace_summary(trace_dir))
    if tmp is None:
        print(trace_line(trace_dir))
    else:
        tmp.cleanup()
    return 130 if result.interrupted else 0
