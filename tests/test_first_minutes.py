"""The first five minutes: a mistyped flag is one line naming the command and the flag it meant, no flag
is taken by abbreviation, the default workload fits the default context, a run ends naming the command
that opens its trace, the default CPU run has queueing to show, and an existing trace is refused at once."""
import json
import subprocess
import sys

import pytest

import traces
import traces.__main__ as traces_main
from engine.cli import main as engine_main
from engine.core.config import CacheConfig, SchedulerConfig
from sim.cli import main as sim_main
from traces.console import trace_line
from tui.cli import main as tui_main
from workloads import DEFAULT_WORKLOAD, load_workload

from sim_helpers import TINY_WORKLOAD, FixedCost

BURSTY = str(DEFAULT_WORKLOAD)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_WORKLOAD)
    return str(path)


@pytest.mark.parametrize("main, argv, expected", [
    (sim_main, ["replay", BURSTY, "--max-num-seq", "4"],
     "sim replay: error: unrecognized argument --max-num-seq (did you mean --max-num-seqs?)"),
    (sim_main, ["compare", "a", "b", "--jsn"], "sim compare: error: unrecognized argument --jsn (did you mean --json?)"),
    (sim_main, ["calibrate", "a", "-o", "p.json", "--outptu", "x"],
     "sim calibrate: error: unrecognized argument --outptu (did you mean --output?)"),
    (sim_main, ["plan", BURSTY, "--slo", "ttft_p99=2s", "--max-num-seq", "4"],
     "sim plan: error: unrecognized argument --max-num-seq (did you mean --max-num-seqs?)"),
    (sim_main, ["import-run", "a", "-o", "b", "--overwrit"],
     "sim import-run: error: unrecognized argument --overwrit (did you mean --overwrite?)"),
    (engine_main, ["run", "--max-num-seq", "4"],
     "engine run: error: unrecognized argument --max-num-seq (did you mean --max-num-seqs?)"),
    (engine_main, ["generate", "hi", "--max-token", "3"],
     "engine generate: error: unrecognized argument --max-token (did you mean --max-tokens?)"),
    (traces_main.main, ["export", "a", "-o", "x.json", "--outpt", "y"],
     "python -m traces export: error: unrecognized argument --outpt (did you mean --output?)"),
    (tui_main, ["a", "--trace-dir"], "tui: error: unrecognized argument --trace-dir"),
])
def test_an_unknown_flag_names_its_command_and_the_nearest_flag(main, argv, expected, capsys):
    assert main(argv) == 2
    assert _one_error_line(capsys) == expected


@pytest.mark.parametrize("flag", [["--max-num-se", "4"], ["--max-num-se=4"], ["--no-prog"]])
def test_an_abbreviated_flag_is_refused_not_read_as_the_full_one(flag, tiny, tmp_path, capsys):
    rc = sim_main(["replay", tiny, "--cost-model", "roofline", "--model", "qwen3-0.6b", "--trace",
                   str(tmp_path / "t"), *flag])
    assert rc == 2
    err = _one_error_line(capsys)
    assert err.startswith(f"sim replay: error: unrecognized argument {flag[0]} (did you mean --")
    assert not (tmp_path / "t").exists()


def test_every_bursty_request_fits_the_default_context():
    limit = SchedulerConfig().max_model_len
    longest = max(r.num_prompt_tokens + r.max_tokens for r in load_workload(DEFAULT_WORKLOAD).requests())
    assert longest <= limit


def test_the_trace_line_names_the_command_that_opens_it():
    assert trace_line("out/") == "trace: out/  (open it: tui out/)"
    assert trace_line("my runs/a") == "trace: my runs/a  (open it: tui 'my runs/a')"


def test_sim_replay_ends_with_the_trace_line(tiny, tmp_path, capsys):
    out = tmp_path / "t"
    assert sim_main(["replay", tiny, "--cost-model", "roofline", "--model", "qwen3-0.6b", "--no-progress",
                     "--trace", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == trace_line(out)


def test_engine_run_ends_with_the_trace_line(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\nseed: 1\nnum_requests: 2\narrival: {process: constant, rate: 50.0}\n"
                        "prompt_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 2}\n")
    out = tmp_path / "t"
    res = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--workload", str(workload), "--trace", str(out),
                          "--device", "cpu", "--kv-cache-memory", str(4 << 20), "--max-model-len", "64",
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == trace_line(out)


def test_the_default_cpu_run_has_requests_waiting_and_preempted(tmp_path):
    """The sizes `engine run` gives its default CPU run, on the simulator's copy of its scheduler: the
    scaled bursty workload waits for KV blocks and preempts."""
    from engine.config import EngineArgs
    from engine.run import cpu_default_sizes
    from engine.workload_driver import CPU_SCALE
    from sim.core.simulator import Simulator
    from sim.core.sources import SimRequest

    args = EngineArgs()
    cpu_default_sizes(args)
    workload = load_workload(DEFAULT_WORKLOAD).scaled(**CPU_SCALE)
    requests = [SimRequest(request_id=r.request_id, arrival=r.arrival, prompt_token_ids=r.prompt_token_ids,
                           max_tokens=r.max_tokens, add_time=r.arrival, num_prompt_tokens=r.num_prompt_tokens)
                for r in workload.requests(vocab_size=4096, max_prompt_tokens=args.max_model_len)]
    assert all(r.prompt_token_ids is not None for r in requests)  # every prompt fits the cut context
    Simulator(SchedulerConfig(max_model_len=args.max_model_len),
              CacheConfig(block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks_override), FixedCost(),
              tmp_path / "t").run(requests)
    t = traces.load(tmp_path / "t")
    assert t.requests["num_preemptions"].sum() > 0
    assert (t.steps["num_waiting"] > 0).any()


@pytest.mark.parametrize("command", [["run"], ["generate", "hi"]])
def test_an_existing_trace_is_refused_before_torch_or_pandas_load(command, tmp_path):
    existing = tmp_path / "t"
    existing.mkdir()
    (existing / "meta.json").write_text(json.dumps({"format_version": traces.FORMAT_VERSION}))
    code = ("import sys\nfrom engine.cli import main\n"
            f"rc = main({[*command, '--trace', str(existing)]!r})\n"
            "print(rc, *(m in sys.modules for m in ('torch', 'transformers', 'pandas')))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["2", "False", "False", "False"], res.stderr
    assert res.stderr.strip().startswith(f"engine {command[0]}: error: {existing}: holds a trace already")
