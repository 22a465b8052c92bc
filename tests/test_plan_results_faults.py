"""`sim plan --results FILE` under faults: results are keyed by the content of every input file (an edited
workload, model config or hardware file is simulated again), a file that is not a results file is one line
naming the file and the line, a Ray address where nothing listens fails within seconds, and sweeps and
--jobs too large to run are one line before anything is allocated."""
import json
import socket
import subprocess
import sys
import time

import pytest
import yaml
from sim_helpers import TINY_WORKLOAD

from engine.core.model_shapes import MODEL_CONFIGS
from sim.cli import main
from sim.plan import reuse as reuse_mod
from sim.plan import sweep as sweep_mod

SLO = "ttft_p99=2s"
GPU = {"name": "my-gpu", "bf16_tflops": 400, "memory_bandwidth_tbps": 2.0, "memory_gib": 80}


def _plan(capsys, workload, *extra: str) -> tuple[int, str, str]:
    code = main(["plan", str(workload), "--slo", SLO, "--no-progress", "--jobs", "1", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _resumed(capsys, workload, results, *extra: str) -> str:
    """The table of a run resumed from `results`, checked equal to a fresh run's over the same inputs (the
    last line, which says where the results came from, aside); that line."""
    code, resumed, _ = _plan(capsys, workload, "--results", str(results), *extra)
    assert code == 0
    code, fresh, _ = _plan(capsys, workload, *extra)
    assert code == 0
    assert resumed.splitlines()[:-1] == fresh.splitlines()[:-1]
    return resumed.splitlines()[-1]


def _workload(tmp_path, text: str = TINY_WORKLOAD):
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return path


def _one_error_line(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and err.startswith("sim plan: error:"), err
    for part in parts:
        assert part in err, err


def test_an_edited_workload_is_simulated_again_not_taken_from_the_results_file(tmp_path, capsys):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    assert _plan(capsys, workload, "--results", str(results))[0] == 0
    assert "(1 from" in _resumed(capsys, workload, results)  # unchanged: resumed
    workload.write_text(TINY_WORKLOAD.replace("value: 600", "value: 6000").replace("value: 4", "value: 40"))
    assert "from" not in _resumed(capsys, workload, results)
    assert len(results.read_text().splitlines()) == 2


def test_an_edited_model_config_file_is_simulated_again(tmp_path, capsys):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    (tmp_path / "model").mkdir()
    config = tmp_path / "model" / "config.json"
    config.write_text(json.dumps(MODEL_CONFIGS["llama-3.1-8b"]))
    assert _plan(capsys, workload, "--results", str(results), "--model", str(config.parent))[0] == 0
    config.write_text(json.dumps({**MODEL_CONFIGS["llama-3.1-8b"], "num_hidden_layers": 80}))
    assert "from" not in _resumed(capsys, workload, results, "--model", str(config.parent))


def test_an_edited_hardware_file_is_simulated_again(tmp_path, capsys):
    workload, results, gpu = _workload(tmp_path), tmp_path / "results.jsonl", tmp_path / "gpu.yaml"
    gpu.write_text(yaml.safe_dump(GPU))
    assert _plan(capsys, workload, "--results", str(results), "--hardware", str(gpu))[0] == 0
    gpu.write_text(yaml.safe_dump({**GPU, "bf16_tflops": 40, "memory_bandwidth_tbps": 0.2}))
    assert "from" not in _resumed(capsys, workload, results, "--hardware", str(gpu))


def test_plan_fingerprints_cover_the_content_of_every_input_file_and_presets_by_name(tmp_path):
    from sim.plan.config import PlanConfig
    from sim.plan.results import input_digests
    from sim.plan.search import PlanSpec

    workload, profile, gpu = _workload(tmp_path), tmp_path / "profile.json", tmp_path / "gpu.yaml"
    profile.write_text("{}")
    gpu.write_text(yaml.safe_dump(GPU))
    on_file, on_preset = PlanConfig(hardware=str(gpu)), PlanConfig(hardware="h100")

    def ids() -> tuple[str, str]:
        digests = input_digests(str(workload), str(profile), [on_file, on_preset])
        assert "h100" not in digests and "llama-3.1-8b" not in digests  # presets: keyed by their names
        spec = PlanSpec(workload=str(workload), slo=SLO, residual_profile=str(profile), digests=digests)
        return spec.fingerprint(on_file), spec.fingerprint(on_preset)

    first = ids()
    assert ids() == first
    profile.write_text('{"residuals": {}}')
    second = ids()
    assert second[0] != first[0] and second[1] != first[1]
    gpu.write_text(yaml.safe_dump({**GPU, "bf16_tflops": 401}))
    third = ids()
    assert third[0] != second[0] and third[1] == second[1]  # only the configurations on that file


def test_a_yaml_file_given_as_the_results_file_is_one_line_naming_it_and_the_line(tmp_path, capsys):
    other = tmp_path / "other.yaml"  # another workload, not this plan's input
    other.write_text(TINY_WORKLOAD)
    code, _, err = _plan(capsys, _workload(tmp_path), "--results", str(other))
    assert code == 2
    _one_error_line(err, f"--results {other}: line 1:")
    assert other.read_text() == TINY_WORKLOAD  # nothing appended to it


@pytest.mark.parametrize("result, field", [
    ({"max_rate": -1.0}, "result.max_rate:"),
    ({"max_rate": float("nan")}, "result.max_rate:"),
    ({"max_rate": float("inf")}, "result.max_rate:"),
    ({"max_rate": "fast"}, "result.max_rate:"),
    ({"capped": False}, "result.max_rate: missing"),
    ({"max_rate": 1.0, "attainment": -0.5}, "result.attainment:"),
    ({"max_rate": 1.0, "points": [{"rate": -2.0}]}, "result.points[0].rate:"),
    ({"max_rate": 1.0, "headroom": {"peak_running": "many"}}, "result.headroom.peak_running:"),
    ("a string", "result: must be an object"),
])
def test_a_results_line_that_is_not_a_result_is_one_line_naming_the_file_line_and_field(tmp_path, capsys, result,
                                                                                          field):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    good = {"plan": "another-plan", "key": "{}", "config": {}, "result": {"max_rate": 2.0}}
    bad = {**good, "result": result}
    results.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    code, _, err = _plan(capsys, workload, "--results", str(results))
    assert code == 2
    _one_error_line(err, f"--results {results}: line 2: {field}")


@pytest.mark.parametrize("line", ["[1, 2]", '{"plan": "p", "key": 3, "result": {"max_rate": 1.0}}',
                                  '{"plan": "p", "result": {"max_rate": 1.0}}', "not json at all"])
def test_a_results_line_that_is_not_a_results_record_is_one_line_naming_the_file_and_line(tmp_path, capsys, line):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    results.write_text(line + "\n")
    code, _, err = _plan(capsys, workload, "--results", str(results))
    assert code == 2
    _one_error_line(err, str(results), "line 1")


def test_a_results_line_over_the_length_bound_is_one_line_error(tmp_path, capsys):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    results.write_text('{"plan": "p", "key": "' + "k" * (2 << 20) + '"}\n')
    code, _, err = _plan(capsys, workload, "--results", str(results))
    assert code == 2
    _one_error_line(err, str(results), "line 1", "MiB")


def test_a_torn_last_line_is_skipped_and_dropped_so_the_file_stays_one_result_per_line(tmp_path, capsys):
    workload, results = _workload(tmp_path), tmp_path / "results.jsonl"
    assert _plan(capsys, workload, "--results", str(results))[0] == 0
    whole = results.read_text()
    results.write_text(whole[:60])  # the sweep was killed while writing its only line
    assert _plan(capsys, workload, "--results", str(results))[0] == 0
    assert [json.loads(line) for line in results.read_text().splitlines()] == [json.loads(whole)]


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_where_nothing_listens_fails_within_seconds_with_one_line(tmp_path):
    pytest.importorskip("ray")
    workload, address = _workload(tmp_path), f"127.0.0.1:{_free_loopback_port()}"
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; from sim.cli import main; sys.exit(main(sys.argv[1:]))",
                               "plan", str(workload), "--slo", SLO, "--no-progress", "--ray", address],
                              capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("--ray to a port where nothing listens was still trying after 40 s")
    assert time.monotonic() - start < 40
    assert proc.returncode == 2, proc.stderr
    _one_error_line(proc.stderr, f"--ray {address}: nothing answers there")


def _no_sweep_runs(monkeypatch) -> None:
    """A sweep that got past its checks fails the test at once (rather than running for hours)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the sweep went on to run")

    monkeypatch.setattr(sweep_mod, "expand_configs", refuse)  # reached only by the old, unbounded parse
    monkeypatch.setattr(sweep_mod, "validate_config", refuse)
    monkeypatch.setattr(reuse_mod, "run_plan", refuse)


def test_a_huge_sweep_range_is_one_line_before_it_is_expanded(tmp_path, capsys, monkeypatch):
    from sim.plan.sweep import parse_sweep

    _no_sweep_runs(monkeypatch)
    code, _, err = _plan(capsys, _workload(tmp_path), "--sweep", "replicas=1..1000000")
    assert code == 2
    _one_error_line(err, "--sweep", "replicas")
    with pytest.raises(ValueError, match="replicas"):  # after: the unbounded parse would make 10**8 values
        parse_sweep("replicas=1..100000000")


def test_a_sweep_of_too_many_combinations_is_one_line_before_they_are_made(tmp_path, capsys, monkeypatch):
    real = sweep_mod.expand_configs
    _no_sweep_runs(monkeypatch)
    monkeypatch.setattr(sweep_mod, "expand_configs", real)  # the count is checked in there
    code, _, err = _plan(capsys, _workload(tmp_path), "--sweep", "replicas=1..200,max_num_seqs=1..200")
    assert code == 2
    _one_error_line(err, "--sweep", "40,000")


def test_jobs_over_the_bound_is_one_line_and_starts_no_process(tmp_path, capsys, monkeypatch):
    import concurrent.futures

    def refuse(*args, **kwargs):
        raise AssertionError("a process pool was started")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", refuse)
    code = main(["plan", str(_workload(tmp_path)), "--slo", SLO, "--no-progress", "--jobs", "100000",
                 "--sweep", "replicas=1..2"])
    err = capsys.readouterr().err
    assert code == 2
    _one_error_line(err, "--jobs")
