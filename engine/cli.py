"""`engine` command line: `engine generate` for prompts, `engine run` for workloads.

Bad input ends with one line naming what is wrong and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import logging
import sys

from engine.config import EngineArgs
from engine.core.flags import OneLineParser, add_flags, flag_error, flags_of
from traces.console import Run, command, run_command, trace_line
from workloads.flags import add_workload_flags


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = command(OneLineParser(prog="engine", description="stepscope's live engine (vLLM v1 style)."))
    sub = p.add_subparsers(dest="command")
    gen = command(sub.add_parser("generate", help="generate text for one or more prompts"), _engine(_generate))
    gen.add_argument("prompts", nargs="+", help="prompt text")
    _add_sampling_args(gen)
    add_flags(gen.add_argument_group("engine"), flags_of(EngineArgs))
    run = command(sub.add_parser("run", help="run a workload on the wall clock and write a trace directory"),
                  _engine(_run))
    run.add_argument("--workload", default=None, help="workload YAML (default: workloads/bursty.yaml, "
                                                      "scaled down on a CPU)")
    add_workload_flags(run, "engine run")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--backend", choices=("stepscope", "vllm"), default="stepscope",
                     help="stepscope's engine, or real vLLM recorded by its own scheduler (the vllm extra)")
    add_flags(run.add_argument_group("engine"), flags_of(EngineArgs))
    return p


def _engine(run: Run) -> Run:
    """A subcommand of the engine: logs to stderr, and a config error names the flag, not the dataclass field."""
    def engine_command(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        try:
            return run(args)
        except ValueError as e:
            raise flag_error(e, flags_of(EngineArgs)) from None
    return engine_command


def _run(args: argparse.Namespace) -> int:
    from engine.run import main_run

    return main_run(args)


def _generate(args: argparse.Namespace) -> int:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, min_p=args.min_p, seed=args.sampling_seed, stop=args.stop,
                            ignore_eos=args.ignore_eos)
    engine_args = EngineArgs.from_cli_args(args)
    if engine_args.trace is not None:  # before torch loads: refused at once, not after the model
        from engine.run import model_inputs
        from traces.trace_dir import check_trace_output

        check_trace_output(engine_args.trace, engine_args.overwrite, model_inputs(args))
    from engine import LLM

    llm = LLM(**{k: v for k, v in vars(engine_args).items()})
    try:
        outputs = llm.generate(list(args.prompts), params, use_tqdm=False)
    except BaseException:  # Ctrl-C or SIGTERM: the trace is closed as cut short, never left open
        llm.shutdown(interrupted=True)
        raise
    llm.shutdown()
    for out in outputs:
        comp = out.outputs[0]
        if out.error:
            print(f"[{out.request_id}] error: {out.error}", file=sys.stderr)
            continue
        print(f"[{out.request_id}] {out.prompt!r} -> {comp.text!r} ({len(comp.token_ids)} tokens, {comp.finish_reason})")
    if engine_args.trace is not None:
        print(trace_line(engine_args.trace))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
