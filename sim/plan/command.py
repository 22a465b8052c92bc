"""`sim plan`: capacity planning. Expands the sweep into configurations, has each one's max rate within
the SLOs searched (sim.plan.search) on local processes or Ray (sim.plan.sweep), sparing the simulations
proven to run as one already done (sim.plan.reuse), prints them ranked with a recommendation
(sim.plan.table); `--plots` draws the curves the search saw and the Pareto front (sim.plan.plots).
Those load when the plan runs, not when `sim` builds its parser.
"""
from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from sim.cost_models import DEFAULT_HARDWARE, DEFAULT_MODEL
from sim.cost_models.hardware import HARDWARE
from sim.flags import add_engine_flags, config_error, sim_flags
from sim.plan.config import DEFAULT_ROUTER, PlanConfig
from sim.plan.window import DEFAULT_WINDOW
from workloads.flags import add_workload_flags, workload_options

if TYPE_CHECKING:
    import argparse


def plan_arguments(p: argparse.ArgumentParser) -> None:
    """`sim plan`'s flags, on its subparser of `sim`."""
    p.add_argument("workload", metavar="FILE.yaml")
    p.add_argument("--slo", required=True, help="e.g. ttft_p99=2s,tpot_p99=80ms")
    p.add_argument("--sweep", default=None, help="e.g. replicas=1..8,max_num_seqs=64,128,256,router=round_robin")
    p.add_argument("--hardware", default=None, help=f"comma list of {', '.join(sorted(HARDWARE))} "
                   f"(default {DEFAULT_HARDWARE})")
    p.add_argument("--model", default=None, help=f"comma list of roofline model presets (default {DEFAULT_MODEL})")
    p.add_argument("--router", default=None, help=f"comma list of routers (default {DEFAULT_ROUTER})")
    p.add_argument("--replicas", type=int, default=1, help="replicas when not swept")
    p.add_argument("--price", default=None, help="dollars per GPU-hour, e.g. h200=3.5/h,h100=2.5/h")
    p.add_argument("--rate-tol", type=float, default=0.05, help="relative tolerance of the max-rate search")
    add_workload_flags(p, "sim plan")
    p.add_argument("--min-served-ratio", type=float, default=0.95, help="served / offered rate a rate must reach "
                   "over the measurement window (the deployment keeps up: its queue stops growing)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="N",
                   help="requests measured per rate at least; the window, the warm-up before it and the tail after "
                   "it each also last two request lifetimes at full load (the workload is looped to fill them)")
    p.add_argument("--jobs", type=int, default=None, help="local worker processes (default: all cores)")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run on a Ray cluster ('auto': a local one)")
    p.add_argument("--results", default=None, metavar="FILE", help="JSON lines of finished configurations; resumes")
    p.add_argument("--plots", default=None, metavar="DIR", help="latency-vs-rate and cost-frontier PNGs")
    p.add_argument("--trace", default=None, metavar="DIR", help="cluster trace of the top configuration at its max rate")
    p.add_argument("--overwrite", action="store_true", help="replace a trace already in --trace DIR")
    p.add_argument("--samples", type=int, default=0, metavar="N", help="with --residuals: rerun each "
                   "configuration's final search N times under seeded draws of measured step-time scatter")
    p.add_argument("--residuals", default=None, metavar="PROFILE.json",
                   help="calibration profile whose measured residuals --samples draws from")
    p.add_argument("--no-reuse", action="store_true", help="simulate every configuration, even one proven to run "
                   "exactly as another already simulated (sim.plan.reuse)")
    p.add_argument("--json", action="store_true", help="print the ranked rows as JSON")
    p.add_argument("--no-progress", action="store_true")
    add_engine_flags(p, "plan")


def _configs(args: argparse.Namespace) -> tuple[list[PlanConfig], list[str]]:
    from sim.plan.sweep import expand_configs, parse_sweep

    sweep = parse_sweep(args.sweep) if args.sweep else {}
    for key, text, default in (("hardware", args.hardware, DEFAULT_HARDWARE), ("model", args.model, DEFAULT_MODEL),
                               ("router", args.router, DEFAULT_ROUTER)):
        if text is not None and key in sweep:
            raise ValueError(f"--{key} and --sweep {key}=... both given; use one")
        if key not in sweep:
            sweep[key] = [v.strip() for v in (text or default).split(",") if v.strip()]
            if not sweep[key]:
                raise ValueError(f"--{key}: no value given")
    given = {fl.field: getattr(args, fl.dest) for fl in sim_flags("plan") if getattr(args, fl.dest) is not None}
    if "num_gpu_blocks_override" in given:
        given["num_gpu_blocks"] = given.pop("num_gpu_blocks_override")
    configs = expand_configs(sweep, PlanConfig(replicas=args.replicas, **given))
    swept = sorted(k for k, v in sweep.items() if len(v) > 1) or ["replicas", "hardware"]
    return configs, swept


def check_plan_outputs(args: argparse.Namespace, configs: list[PlanConfig]) -> None:
    """Every output refused now, not after the whole sweep, if it would land on one of the plan's inputs."""
    from traces.outputs import Output, check_outputs, existing_paths
    from traces.trace_dir import check_trace_output

    inputs = [args.workload, args.residuals,
              *existing_paths(*sorted({str(c.model) for c in configs} | {str(c.hardware) for c in configs}))]
    outputs = [Output("--results", args.results)] if args.results else []
    check_outputs(outputs + ([Output("--plots", args.plots, directory=True)] if args.plots else []), inputs)
    if args.trace:
        check_trace_output(args.trace, args.overwrite, inputs)


def plan(args: argparse.Namespace) -> int:
    """`sim plan ...`; bad input raises, for `sim`'s one error path (one line, exit status 2). A Ctrl-C
    ends it saying where the finished configurations are."""
    if not os.path.isfile(args.workload):
        raise ValueError(f"{args.workload}: no such workload file")
    try:
        return _plan(args)
    except KeyboardInterrupt:
        print("sim plan: interrupted; finished configurations are in --results (rerun to resume)"
              if args.results else "sim plan: interrupted", file=sys.stderr)
        return 130


def _plan(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sim.plan.reuse import run_plan
    from sim.plan.results import input_digests
    from sim.plan.search import (ConfigResult, PlanSpec, base_rate, base_requests, request_lifetime, run_at_rate,
                                 window_at)
    from sim.plan.sweep import MAX_JOBS, append_result, load_results, parse_price, validate_config
    from sim.plan.table import format_table, rank, recommend
    from traces.metrics import parse_slo

    slos = parse_slo(args.slo)
    if not 0 < args.rate_tol < 1:
        raise ValueError(f"--rate-tol: must be in (0, 1), got {args.rate_tol}")
    workload = workload_options(args, "sim plan")
    for flag, value in (("--jobs", args.jobs), ("--replicas", args.replicas)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    if args.jobs is not None and args.jobs > MAX_JOBS:
        raise ValueError(f"--jobs: at most {MAX_JOBS} worker processes, got {args.jobs}")
    if not 10 <= args.window <= 1_000_000:
        raise ValueError(f"--window: must be in [10, 1000000] requests, got {args.window}")
    if not 0 <= args.min_served_ratio <= 1:
        raise ValueError(f"--min-served-ratio: must be in [0, 1], got {args.min_served_ratio}")
    if args.samples < 0 or (args.samples and not args.residuals):
        raise ValueError("--samples: needs N >= 1 and --residuals PROFILE.json (the measured scatter to draw from)")
    if args.residuals:
        from sim.plan.search import residual_table

        residual_table(os.path.abspath(args.residuals))
    prices = parse_price(args.price) if args.price else {}
    configs, swept = _configs(args)
    try:
        for config in configs:
            validate_config(config)
    except ValueError as e:
        raise config_error(e) from None
    swept_hardware = {str(c.hardware).lower() for c in configs}
    unpriced = sorted(set(prices) - swept_hardware)
    if unpriced:
        raise ValueError(f"--price {unpriced[0]}: not among the hardware planned ({', '.join(sorted(swept_hardware))})")
    check_plan_outputs(args, configs)
    spec = PlanSpec(workload=os.path.abspath(args.workload), slo=args.slo, rate_tol=args.rate_tol,
                    max_requests=workload.max_requests, length_scale=workload.length_scale,
                    vocab_size=workload.vocab_size,
                    seed=args.seed or 0, min_served_ratio=args.min_served_ratio, window=args.window,
                    samples=args.samples,
                    residual_profile=os.path.abspath(args.residuals) if args.residuals else None)
    spec.lifetime_s = request_lifetime(spec, configs)
    # The arrivals are all the offered rate needs: no prompt's ids are made for it (max_prompt_tokens 0).
    offered_rate = base_rate(base_requests(spec.workload, spec.max_requests, spec.length_scale, spec.vocab_size, 0))
    spec.digests = input_digests(spec.workload, spec.residual_profile, configs)
    plan_ids = {c.key: spec.fingerprint(c) for c in configs}  # results keyed by every input file's content
    done = load_results(args.results, plan_ids) if args.results else {}
    results = {c.key: done[c.key] for c in configs if c.key in done}
    todo = [c for c in configs if c.key not in results]
    bar = tqdm(total=len(configs), initial=len(results), desc="plan", unit="config", disable=args.no_progress,
               dynamic_ncols=True)

    def on_done(config: PlanConfig, result: ConfigResult) -> None:
        results[config.key] = result
        if args.results:
            append_result(args.results, plan_ids[config.key], config, result)
        if not bar.disable:  # each answer as it lands, above the bar (stdout keeps the table alone)
            answer = result.note or f"max rate {'>=' if result.capped else ''}{result.max_rate:.3f} req/s"
            bar.write(f"{config.label(swept)}: {answer}", file=sys.stderr)
        bar.update(1)

    try:
        reused = run_plan(spec, todo, on_done, jobs=args.jobs or os.cpu_count() or 1, ray_address=args.ray,
                          known=results, reuse=not args.no_reuse)
    finally:
        bar.close()
    rows = rank([(c, results[c.key]) for c in configs], prices)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], default=str))
    else:
        print(format_table(rows, swept, args.rate_tol))
        print(recommend(rows, offered_rate, swept))
        how = [f"{len(todo) - reused.configs} simulated, {reused.configs} proven to run as one simulated; "
               f"{reused.runs_simulated} runs simulated, {reused.runs} taken from runs proven alike"] if reused.configs or reused.runs else []
        if len(todo) < len(configs):
            how.append(f"{len(configs) - len(todo)} from {args.results}")
        listed = f" ({', '.join(how)})" if how else ""
        print(f"window: at least {spec.window} requests and two request lifetimes ({2 * spec.lifetime_s:.1f} s) of "
              f"arrivals, after a warm-up and before a tail as long; at #1's max rate: "
              f"{window_at(spec, rows[0].max_rate or offered_rate).describe()}")
        print(f"{len(configs)} configurations{listed}; SLOs: {', '.join(s.label for s in slos)}")
    if args.plots:
        from sim.plan.plots import write_plan_plots

        models = sorted({str(c.model) for c in configs})
        hardware = sorted({str(c.hardware) for c in configs})
        title = (f"{os.path.basename(args.workload)} · {','.join(models)} on {','.join(hardware)} · roofline · "
                 f"SLOs {', '.join(s.label for s in slos)}")
        paths = write_plan_plots(rows, results, slos, swept, args.plots, title)
        if not args.json:
            print(f"plots: {', '.join(map(str, paths))}")
    if args.trace and rows and rows[0].max_rate > 0:
        from sim.core.cluster import replica_summary

        table = run_at_rate(spec, rows[0].config, rows[0].max_rate, args.trace, overwrite=args.overwrite)
        if not args.json:
            print(f"trace of #1 at {rows[0].max_rate:.3f} req/s: {args.trace}")
            print(replica_summary(table).to_string(index=False))
    return 0
