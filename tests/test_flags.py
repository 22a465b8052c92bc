"""One source of flags: `engine run`, `sim replay` and `sim plan` take the scheduler/cache options under
the same names, types, choices and help, declared once on engine.core's config dataclasses."""
import argparse
import json

import pytest

from engine.cli import build_parser as engine_parser
from engine.cli import main as engine_main
from engine.config import EngineArgs
from engine.core.config import CacheConfig, SchedulerConfig, engine_flags
from sim.cli import build_parser as sim_parser
from sim.cli import main as sim_main
from sim.flags import sim_flags
from sim.plan.command import _configs
from sim.plan.config import PlanConfig
from workloads import DEFAULT_WORKLOAD

BURSTY = str(DEFAULT_WORKLOAD)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _shape(action: argparse.Action) -> tuple:
    return action.dest, action.type, action.choices, action.help, type(action)


def plan_parser() -> argparse.ArgumentParser:
    return _subparser(sim_parser(), "plan")


ENGINE_RUN = _options(_subparser(engine_parser(), "run"))
SIM_PARSERS = {"replay": _options(_subparser(sim_parser(), "replay")), "plan": _options(plan_parser())}


@pytest.mark.parametrize("command", SIM_PARSERS)
def test_every_engine_flag_the_simulator_uses_has_the_engines_name_type_choices_and_help(command):
    sim = SIM_PARSERS[command]
    for fl in sim_flags(command):
        assert _shape(sim[fl.flag]) == _shape(ENGINE_RUN[fl.flag]), fl.flag
        assert sim[fl.flag].default is None  # from the source trace, else the engine default


@pytest.mark.parametrize("command", SIM_PARSERS)
def test_only_flags_marked_engine_only_are_missing_from_the_simulator(command):
    missing = {fl.flag for fl in engine_flags()} - set(SIM_PARSERS[command])
    assert missing == {fl.flag for fl in engine_flags() if fl.sim is not True and fl.sim != command}
    assert "--kv-cache-memory" in missing and "--max-num-seqs" not in missing


def test_async_scheduling_is_a_replay_and_plan_flag_and_full_isl_admission_replay_only():
    assert {"--async-scheduling", "--scheduler-reserve-full-isl"} <= set(SIM_PARSERS["replay"])
    assert "--async-scheduling" in SIM_PARSERS["plan"]
    assert "--scheduler-reserve-full-isl" not in SIM_PARSERS["plan"]


def test_engine_run_without_flags_gives_the_config_defaults():
    args = EngineArgs.from_cli_args(_subparser(engine_parser(), "run").parse_args([]))
    assert args == EngineArgs()
    sched, cache = SchedulerConfig(), CacheConfig()
    assert (args.max_num_seqs, args.long_prefill_token_threshold, args.scheduling_policy,
            args.enable_chunked_prefill) == (sched.max_num_seqs, sched.long_prefill_token_threshold, sched.policy,
                                             sched.enable_chunked_prefill)
    assert (args.block_size, args.gpu_memory_utilization, args.enable_prefix_caching) == (
        cache.block_size, cache.gpu_memory_utilization, cache.enable_prefix_caching)


def test_engine_args_repeat_the_scheduler_and_cache_options_with_their_defaults():
    declared = {fl.flag: fl for fl in engine_flags()}
    for fl in (fl for fl in _engine_args_flags() if fl.owner in ("SchedulerConfig", "CacheConfig")):
        expected = declared[fl.flag]
        assert (fl.type, fl.choices, fl.help) == (expected.type, expected.choices, expected.help)
        # The engine resolves these two by the model and the device.
        assert fl.default == expected.default or fl.flag in ("--max-model-len", "--async-scheduling")


def _engine_args_flags():
    from engine.core.flags import flags_of

    return flags_of(EngineArgs)


def test_sim_plan_defaults_are_the_engine_defaults_and_the_old_results_key(tmp_path):
    args = plan_parser().parse_args([BURSTY, "--slo", "ttft_p99=1s"])
    (config,), _ = _configs(args)
    # The dict a results file keyed configurations by before PlanConfig: resuming it must still match.
    old = {"replicas": 1, "router": "least_outstanding", "hardware": "h100", "model": "llama-3.1-8b",
           "max_model_len": 32768, "max_num_seqs": None, "max_num_batched_tokens": None, "block_size": 16,
           "long_prefill_token_threshold": None, "policy": None, "enable_chunked_prefill": None,
           "enable_prefix_caching": None, "gpu_memory_utilization": None, "num_gpu_blocks": None}
    assert config.key == json.dumps(old, sort_keys=True)
    assert config.scheduler_config() == SchedulerConfig(max_model_len=32768)
    assert config.cache_config(num_gpu_blocks=100) == CacheConfig(num_gpu_blocks=100)


def test_sim_plan_flags_land_in_the_configuration_under_the_config_field_names():
    args = plan_parser().parse_args([BURSTY, "--slo", "ttft_p99=1s", "--scheduling-policy", "priority",
                                     "--num-gpu-blocks-override", "500", "--no-enable-prefix-caching"])
    (config,), _ = _configs(args)
    assert (config.policy, config.num_gpu_blocks, config.enable_prefix_caching) == ("priority", 500, False)
    assert config.scheduler_config().policy == "priority"
    assert config.cache_config().num_gpu_blocks == 500


def test_sim_replay_without_flags_uses_the_engine_defaults():
    from sim.cli import build_configs
    from sim.cost_models import get_cost_model
    from sim.core.sources import open_source

    args = _subparser(sim_parser(), "replay").parse_args([BURSTY])
    source = open_source(BURSTY, 32000, 4, 1.0)
    cost = get_cost_model("roofline", None, model="llama-3.1-8b", hardware="h100")
    sched, cache, _ = build_configs(args, source, cost)
    assert sched == SchedulerConfig(max_model_len=cost.max_model_len)
    assert (cache.block_size, cache.gpu_memory_utilization, cache.enable_prefix_caching) == (
        CacheConfig().block_size, CacheConfig().gpu_memory_utilization, CacheConfig().enable_prefix_caching)


def _run(command: str, extra: list[str]) -> int:
    if command == "engine run":
        return engine_main(["run", *extra])
    if command == "sim replay":
        return sim_main(["replay", BURSTY, "--no-progress", *extra])
    return sim_main(["plan", BURSTY, "--slo", "ttft_p99=1s", "--no-progress", *extra])


@pytest.mark.parametrize("command", ["engine run", "sim replay", "sim plan"])
def test_a_bad_choice_is_one_line_naming_the_flag_and_exit_2(capsys, command):
    assert _run(command, ["--scheduling-policy", "lifo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scheduling-policy" in err and "'lifo'" in err


@pytest.mark.parametrize("command", ["sim replay", "sim plan"])
def test_a_bad_value_is_reported_under_the_flag_name(capsys, command, tmp_path):
    assert _run(command, ["--max-num-seqs", "0", "--max-requests", "4", "--trace", str(tmp_path / "t")]
                if command == "sim replay" else ["--max-num-seqs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-num-seqs: must be an int in [1, " in err and "got 0" in err


def test_plan_configurations_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        PlanConfig(2)
    with pytest.raises(AttributeError):
        PlanConfig().replicas = 3
