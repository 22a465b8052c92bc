"""`sim` command line: `replay` a workload file or an engine trace on the engine's own scheduler,
`compare` two traces, `calibrate` a cost model from engine traces, `plan` capacity under SLOs,
`import-run` a measured vLLM run. Each subcommand is declared on one parser and run through
traces.console's edge: bad input is one line on stderr and exit status 2, never a traceback.

Scheduler and cache flags carry the engine's names and meaning (sim.flags), the workload flags the
workload's (workloads.flags). What a cost model can do (draw seeded scatter, follow a trace's schedule)
is asked of the model it built (sim.cost_models.base), never read off its name.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cost_models import DEFAULT_HARDWARE, DEFAULT_MODEL
from sim.cost_models.hardware import hardware_help
from sim.flags import (OneLineParser, add_deployment_flags, add_engine_flags, config_error, deployment_of,
                       layout_change, recorded_or_flag, sim_flags)
from traces.console import command, run_command, trace_line
from traces.outputs import Output, check_outputs, existing_paths
from traces.recorder import TRACE_LEVELS
from traces.trace_dir import check_trace_output
from workloads.flags import add_workload_flags, workload_options

if TYPE_CHECKING:
    from engine.core.config import CacheConfig, SchedulerConfig
    from sim.core.simulator import SimResult
    from sim.core.sources import Source
    from sim.cost_models.base import CostModel

DEFAULT_NUM_GPU_BLOCKS = 8192


def build_parser() -> argparse.ArgumentParser:
    from sim.calibration.command import calibrate_arguments, run_calibrate
    from sim.fidelity.import_run import import_run, import_run_arguments
    from sim.plan.command import plan, plan_arguments

    p = command(OneLineParser(prog="sim", description="Discrete-event simulator on the engine's own scheduler."))
    sub = p.add_subparsers(dest="command")
    replay_arguments(command(sub.add_parser("replay", help="simulate a workload file or replay an engine trace "
                                            "directory"), replay))
    c = command(sub.add_parser("compare", help="fidelity report of trace B against trace A"), compare)
    c.add_argument("trace_a", metavar="TRACE_DIR_A")
    c.add_argument("trace_b", metavar="TRACE_DIR_B")
    c.add_argument("--json", action="store_true", help="machine-readable report")
    c.add_argument("--plots", default=None, metavar="DIR", help="write QQ plots of TTFT and ITL (B against A)")
    calibrate_arguments(command(sub.add_parser(
        "calibrate", help="fit a cost model from engine traces (sim calibrate -h)",
        description="Fit a calibrated cost model (PROFILE.json) to engine traces."), run_calibrate))
    plan_arguments(command(sub.add_parser(
        "plan", help="capacity planning under SLOs (sim plan -h)", description="Capacity planning: max request rate "
        "within SLOs per configuration, ranked by cost per million output tokens."), plan))
    import_run_arguments(command(sub.add_parser(
        "import-run", help="a measured vLLM run (run bundle or vllm bench serve result) as a trace directory "
        "(sim import-run -h)", description="Bring a measured vLLM run in as a trace directory: an LLMServingSim run "
        "bundle (RUN_DIR with vllm/meta.json and vllm/requests.jsonl) or a `vllm bench serve --save-result "
        "--save-detailed` JSON file."), import_run))
    return p


def replay_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("source", metavar="FILE.yaml|TRACE_DIR")
    r.add_argument("--trace", default=None, metavar="DIR",
                   help="write the trace here (default: runs/<source>-sim-<date-time>/)")
    r.add_argument("--overwrite", action="store_true", help="replace a trace already in --trace DIR")
    r.add_argument("--cost-model", default=None, help="recorded | calibrated | roofline | aiconfigurator | "
                   "PROFILE.json | BUNDLE_DIR (kernels measured on the GPU) (default: recorded for an engine trace, "
                   "roofline for a workload or an imported run)")
    r.add_argument("--profile", default=None, metavar="PROFILE.json", help="for calibrated (or roofline on cpu)")
    r.add_argument("--step-noise", action="store_true",
                   help="a cost model with measured residuals (PROFILE.json): one replay with them drawn in blocks, "
                   "seeded by --seed")
    r.add_argument("--samples", type=int, default=None, metavar="N",
                   help="a cost model with measured residuals (PROFILE.json): the prediction is the interval of N "
                   "seeded replays, median [p5-p95] per metric, kept in the trace's meta for `sim compare`")
    r.add_argument("--model", default=None, help=f"model preset, config.json or a directory holding one (default: "
                   f"the trace's model, else {DEFAULT_MODEL})")
    r.add_argument("--hardware", default=None, help=f"{hardware_help()} (default {DEFAULT_HARDWARE}, or a bundle's "
                   "own GPU)")
    add_deployment_flags(r)
    add_workload_flags(r, "sim replay")
    r.add_argument("--slo", default=None, help="e.g. ttft_p99=2s,tpot_p99=80ms: goodput and attainment")
    r.add_argument("--plots", default=None, metavar="DIR", help="write latency CDF / throughput / queue / KV PNGs")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--trace-level", default="full", choices=TRACE_LEVELS, help="full: every table | steps: steps "
                   "and requests, no decisions or block events | none: requests only (metrics without ITL or KV usage)")
    add_engine_flags(r, "replay")


def _json(obj: Any) -> str:
    """Strict JSON: orjson writes NaN and infinity (a metric with no samples) as null; numpy values too."""
    import orjson

    return orjson.dumps(obj, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


def build_configs(args: argparse.Namespace, source: Source,
                  cost_model: CostModel) -> tuple[SchedulerConfig, CacheConfig, str]:
    """SchedulerConfig and CacheConfig from flags, then the source trace's config, then engine defaults."""
    import dataclasses

    from engine.core.config import CacheConfig, SchedulerConfig

    sc, cc = source.scheduler, source.cache
    sched_kw = recorded_or_flag(SchedulerConfig, args, sc)
    if "max_model_len" not in sched_kw and cost_model.max_model_len:
        sched_kw["max_model_len"] = cost_model.max_model_len
    # The trace's num_gpu_blocks (below) already carries any override it ran with.
    cache_kw = recorded_or_flag(CacheConfig, args, cc, skip=("num_gpu_blocks_override",))
    if cc.get("watermark"):
        cache_kw["watermark"] = cc["watermark"]
    try:
        sched = SchedulerConfig(**sched_kw)
        cache = CacheConfig(**cache_kw, num_gpu_blocks_override=args.num_gpu_blocks_override)
        block_size, gpu_util = cache.block_size, cache.gpu_memory_utilization
        if args.num_gpu_blocks_override is not None:
            blocks, how = args.num_gpu_blocks_override, "--num-gpu-blocks-override"
        elif cc.get("num_gpu_blocks"):
            # Same KV memory as the traced engine, re-cut if the block size changed.
            blocks = max(2, int(cc["num_gpu_blocks"]) * int(cc.get("block_size") or block_size) // block_size)
            how = f"the source trace's KV cache ({cc['num_gpu_blocks']} blocks of {cc.get('block_size')} tokens)"
        elif cc.get("kv_cache_memory_bytes") and (blocks := cost_model.num_gpu_blocks(
                block_size, gpu_util, sched.token_budget, int(cc["kv_cache_memory_bytes"]))) is not None:
            how = f"{cost_model.name} cost model: the run's KV cache of {int(cc['kv_cache_memory_bytes']):,} bytes a GPU"
        elif (blocks := cost_model.num_gpu_blocks(block_size, gpu_util, sched.token_budget)) is not None:
            how = f"{cost_model.name} cost model: memory left after weights at {gpu_util} utilization"
        else:
            blocks, how = DEFAULT_NUM_GPU_BLOCKS, "default"
        cache = dataclasses.replace(cache, num_gpu_blocks=blocks)
    except ValueError as e:
        raise config_error(e) from None
    return sched, cache, how


def _check_flags(args: argparse.Namespace) -> None:
    workload_options(args, "sim replay")
    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples: must be >= 1, got {args.samples}")
    for flag, value, low in (("--num-gpu-blocks-override", args.num_gpu_blocks_override, 2),
                             ("--tensor-parallel-size", args.tensor_parallel_size, 1),
                             ("--data-parallel-size", args.data_parallel_size, 1)):
        if value is not None and value < low:
            raise ValueError(f"{flag}: must be >= {low}, got {value}")
    if not Path(args.source).exists():
        raise ValueError(f"{args.source}: no such workload file or trace directory")
    inputs = [args.source, args.profile, *existing_paths(args.model, args.hardware, args.cost_model)]
    check_outputs([Output("--plots", args.plots, directory=True)] if args.plots else [], inputs)
    if args.trace is not None:
        check_trace_output(args.trace, args.overwrite, inputs)


def _check_spread(args: argparse.Namespace, cost_model: CostModel) -> None:
    """--samples and --step-noise draw from the cost model's measured scatter: with a model that has none,
    every seeded replay is the same and its "interval" would be a single point, so they are refused."""
    if (args.samples or args.step_noise) and not cost_model.has_residuals:
        flag = "--samples" if args.samples else "--step-noise"
        raise ValueError(f"{flag}: the {cost_model.name} cost model has no measured step-time scatter, so every "
                         "seeded replay would be the same; use --cost-model PROFILE.json (from `sim calibrate`)")


def _simulate(args: argparse.Namespace, trace_dir: str, residual_seed: int | None = None,
              progress: bool = False, announce: bool = False, overwrite: bool = False,
              prediction: dict[str, Any] | None = None) -> tuple[SimResult, CostModel]:
    """One replay of `args.source` into `trace_dir`: (SimResult, cost model); `announce` prints first
    what is simulated; `prediction` (the interval of sampled replays) goes into the trace's meta."""
    from engine.core.config import SchedulerConfig
    from sim.core.simulator import Simulator
    from sim.core.sources import open_source
    from sim.cost_models import get_cost_model
    from traces.describe import describe_replay

    # Opened as a recorded replay would read it, when that is what the flags may ask for; reopened below
    # if the cost model built does not follow the trace's schedule after all.
    guess = args.cost_model in (None, "recorded") and args.time_scale == 1.0
    source = open_source(args.source, args.vocab_size, args.max_requests, args.time_scale, exact_times=guess)
    # A trace replays its own step times; a workload or an imported measured run (no steps, by design) the roofline.
    name = args.cost_model or ("recorded" if source.trace is not None and not source.trace.imported else "roofline")
    model = args.model or source.model.get("hf_config") or DEFAULT_MODEL
    recorded = source.trace.meta.get("config") or {} if source.trace is not None else {}
    recorded_layout = {**(recorded.get("model") or {}), **(recorded.get("parallel") or {})}
    deployment = deployment_of(args, recorded_layout)
    measured = name in ("recorded", "calibrated") or name.endswith(".json")
    if measured and deployment != (ran := deployment_of(None, recorded_layout)):
        raise ValueError(f"{layout_change(deployment, ran)}: the {name} cost model prices the layout it measured; use "
                         "roofline, a profile bundle or aiconfigurator")
    recorded_async = recorded_or_flag(SchedulerConfig, args, source.scheduler).get("async_scheduling")
    cost_model = get_cost_model(name, source.trace, model=model, hardware=args.hardware, profile=args.profile,
                                residual_seed=residual_seed, deployment=deployment,
                                async_scheduling=bool(recorded_async if recorded_async is not None
                                                      else SchedulerConfig().async_scheduling),
                                vllm_version=_recorded_vllm(source))
    exact = cost_model.follows_recorded_schedule and args.time_scale == 1.0
    if cost_model.follows_recorded_schedule:
        refuse_schedule_changes(args, source)
    if source.trace is not None and exact != guess:
        source = open_source(args.source, args.vocab_size, args.max_requests, args.time_scale, exact_times=exact)
    _check_spread(args, cost_model)
    sched, cache, how = build_configs(args, source, cost_model)
    source.max_prompt_tokens = sched.max_model_len
    model_meta, simulated_hardware = _simulated_model(source, model, args.hardware, cost_model)
    d = deployment
    parallel = {"tensor_parallel_size": d.tensor_parallel_size, "data_parallel_size": d.data_parallel_size,
                "enable_expert_parallel": d.enable_expert_parallel}
    model_meta = {**model_meta, "kv_cache_dtype": d.kv_cache_dtype, "quantization": d.quantization}
    meta = {"config": {"model": model_meta, "parallel": parallel}, "workload": source.meta,
            "device": {"type": "sim", "hardware": simulated_hardware},
            "kv_cache": {"num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size, "how": how}}
    if prediction is not None:
        meta["prediction"] = prediction
    if announce:
        print(describe_replay(source.path, source.num_requests, meta, cost_model.describe().to_meta(), sched, cache))
    sim = Simulator(sched, cache, cost_model, trace_dir, meta, seed=args.seed or 0, vocab_size=args.vocab_size,
                    follow_recorded=exact, trace_level=args.trace_level, overwrite=overwrite,
                    data_parallel_size=d.data_parallel_size, enforce_eager=bool(source.model.get("enforce_eager")),
                    vllm_version=_recorded_vllm(source))
    return sim.run(source.requests, source.external_finishes, source.num_requests, progress=progress), cost_model


def refuse_schedule_changes(args: argparse.Namespace, source: Source) -> None:
    """Recorded step times price only the recorded schedule: a flag that changes it is one line naming the
    flag, before anything runs (the step-by-step check in the recorded model catches any other departure)."""
    recorded = {**source.scheduler, **source.cache}
    changed = [f"{fl.flag} {getattr(args, fl.dest)}" for fl in sim_flags("replay")
               if getattr(args, fl.dest) is not None and fl.field != "num_gpu_blocks_override"
               and getattr(args, fl.dest) != recorded.get(fl.field)]
    if args.num_gpu_blocks_override is not None and args.num_gpu_blocks_override != recorded.get("num_gpu_blocks"):
        changed.append(f"--num-gpu-blocks-override {args.num_gpu_blocks_override}")
    if args.time_scale != 1.0:
        changed.append(f"--time-scale {args.time_scale:g}")
    if changed:
        raise ValueError(f"{changed[0]}: changes the schedule {args.source} recorded, and --cost-model recorded "
                         "prices only the recorded steps; replay it with a cost model that prices any batch, e.g. "
                         f"fitted to this trace: sim calibrate {args.source} -o P.json, then --cost-model P.json")


def _recorded_vllm(source: Source) -> str | None:
    """The vLLM version a recorded or imported run ran (its all-reduces are priced as that version's)."""
    if source.trace is None:
        return None
    return (source.trace.meta.get("vllm") or {}).get("version")


def replay(args: argparse.Namespace) -> int:
    from sim.report.summary import format_sim_summary, load_for_summary, sim_summary, write_plots
    from traces.metrics import parse_slo

    _check_flags(args)
    slos = parse_slo(args.slo) if args.slo is not None else None
    trace_dir = args.trace if args.trace is not None else default_trace_dir(Path(args.source))
    seed = (args.seed or 0) if args.step_noise else None
    samples = prediction = None
    if args.samples:  # first, so the replay's trace records the interval (and a model without spread fails at once)
        from sim.fidelity.samples import prediction_meta, sample_replays

        samples = sample_replays(args.samples, lambda s, d: _simulate(args, d, s, announce=s == 0 and not args.json),
                                 slos)
        prediction = prediction_meta(samples)
    result, cost_model = _simulate(args, trace_dir, seed, progress=not args.no_progress,
                                   announce=not args.json and samples is None, overwrite=args.overwrite,
                                   prediction=prediction)
    trace = load_for_summary(trace_dir)
    summary = sim_summary(trace, slos)
    for note in cost_model.describe().notes:
        print(f"sim replay: note: {note}", file=sys.stderr)
    warn = cost_model.range_warning()
    if warn:
        print(f"sim replay: warning: {' '.join(warn.split())}", file=sys.stderr)
    if samples is not None:
        summary["samples"] = samples
    if args.json:
        print(_json({"trace": args.trace, "steps": result.num_steps, "sim_time_s": result.sim_time,
                     "wall_time_s": result.wall_time, **summary}))
    else:
        print(f"cost model: {cost_model.name}; {result.num_steps} steps simulated in {result.wall_time:.2f} s "
              f"({result.num_steps / max(result.wall_time, 1e-9):.0f} steps/s)")
        if samples is not None:
            from sim.fidelity.samples import format_samples, point_replay_label

            print(point_replay_label(seed))
        print(format_sim_summary(summary))
        if samples is not None:
            print(format_samples(samples))
    if args.plots:
        paths = write_plots(trace, args.plots, slos=slos)
        if not args.json:
            print(f"plots: {', '.join(str(p) for p in paths)}")
    if not args.json:
        print(trace_line(trace_dir))
    return 130 if result.interrupted else 0


def default_trace_dir(source: Path, now: float | None = None) -> str:
    """`runs/<source name>-sim-<date-time>/`: a replay without --trace keeps its trace where the user finds it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path("runs") / f"{source.stem if source.is_file() else source.name}-sim-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)


def _simulated_model(source: Source, model: str | dict[str, Any], hardware: str | None,
                     cost_model: CostModel) -> tuple[dict[str, Any], str | None]:
    """What the simulated run is a run of: a recorded replay is the traced engine's model and device, a
    fitted law the model and device it was fitted on, any other model the named one on the device it prices."""
    if cost_model.follows_recorded_schedule:
        device = (source.trace.meta.get("device") or {}) if source.trace is not None else {}
        return dict(source.model), device.get("name") or device.get("type")
    info = cost_model.describe()
    if info.fitted_model is not None:
        return {**info.fitted_model, "source": "sim"}, info.hardware
    hardware = info.hardware or hardware or DEFAULT_HARDWARE
    if isinstance(model, str):
        named = info.model if Path(model).exists() else None
        return {"model": named or model, "source": "sim", **({"config": model} if named else {})}, hardware
    return {"model": source.model.get("model") or "hf_config", "source": "sim", "hf_config": model}, hardware


def compare(args: argparse.Namespace) -> int:
    import traces
    from sim.fidelity.compare import compare_traces, format_report

    if args.plots:
        check_outputs([Output("--plots", args.plots, directory=True)], [args.trace_a, args.trace_b])
    a, b = traces.load(args.trace_a), traces.load(args.trace_b)
    report = compare_traces(a, b)
    print(_json(report) if args.json else format_report(report))
    if args.plots:
        from sim.fidelity.compare_plots import write_qq_plots

        paths = write_qq_plots(a, b, args.plots)
        if not args.json:
            print(f"plots: {', '.join(str(p) for p in paths)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Every `sim` command's one error path: what a command raises of these (and OS errors) is one line
    on stderr and exit status 2 (traces.console.run_command)."""
    from sim.core.stepping import SimulationError
    from traces import TraceError

    errors = (TraceError, SimulationError, ValueError)  # workload, cost model and config errors are ValueErrors
    return run_command(build_parser(), argv, errors)


if __name__ == "__main__":
    sys.exit(main())
