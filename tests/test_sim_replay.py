"""`sim replay`: a recorded replay makes the engine's decisions at every step; workload replays are
deterministic and keep no state per finished request; bad input is one line and exit 2."""
import json

import pandas as pd
import pytest
from core_helpers import EOS, make_scheduler
from trace_compare import STEP_COLUMNS, as_lists

import traces
from engine.core import ModelRunnerOutput, Request, RequestStatus, SamplingParams
from sim.cost_models.base import CostModelInfo, CostModelDefaults, StepTiming
from sim.cost_models.batch import StepBatch
from sim.cli import main
from sim.core.simulator import Simulator
from sim.core.sources import open_source
from traces.recorder import TraceRecorder
from traces.writer import TraceWriter
from workloads import DEFAULT_WORKLOAD
from recording import record_step
from trace_builders import prefix_sharing_workload

BURSTY = str(DEFAULT_WORKLOAD)

ENGINE_WORKLOAD = prefix_sharing_workload("sim-equivalence", {"process": "poisson", "rate": 300.0}, num_requests=16,
                                          max_prompt=70, prefix_tokens=24)


@pytest.fixture(scope="module")
def engine_trace(tmp_path_factory):
    """A CPU engine run of the built-in model with staggered arrivals, a KV cache small enough to
    preempt, a step budget small enough to chunk prefills, and shared prefixes."""
    from engine.config import EngineArgs
    from engine.llm_engine import LLMEngine
    from engine.workload_driver import run_workload
    from workloads import workload_from_dict

    path = tmp_path_factory.mktemp("engine") / "trace"
    args = EngineArgs(device="cpu", num_threads=1, max_model_len=128, block_size=8, num_gpu_blocks_override=20,
                      max_num_batched_tokens=48, max_num_seqs=6, trace=str(path))
    engine = LLMEngine(args.create_engine_config())
    run_workload(engine, workload_from_dict(ENGINE_WORKLOAD), progress=False)
    engine.shutdown()
    return path


@pytest.fixture(scope="module")
def replayed(engine_trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "trace"
    assert main(["replay", str(engine_trace), "--cost-model", "recorded", "--trace", str(out), "--no-progress"]) == 0
    return traces.load(engine_trace), traces.load(out)


def test_engine_fixture_has_preemptions_chunked_prefills_prefix_hits_and_staggered_arrivals(replayed):
    eng, _ = replayed
    d = eng.decisions
    assert (d["event"] == "preempt").any()
    prompt_len = eng.requests.set_index("request_id")["num_prompt_tokens"]
    first = d[d["event"] == "schedule"].groupby("request_id").first()
    assert (first["num_tokens"] < prompt_len[first.index] - first["prefix_hit_tokens"]).any()
    assert eng.steps["prefix_hit_tokens"].sum() > 0
    assert (eng.requests["queued"] > eng.steps["start"].iloc[0]).any()


def test_recorded_replay_makes_identical_decisions_at_every_step(replayed):
    eng, sim = replayed
    assert len(sim.steps) == len(eng.steps)
    assert as_lists(sim.decisions).equals(as_lists(eng.decisions))
    assert sim.steps[STEP_COLUMNS].reset_index(drop=True).equals(eng.steps[STEP_COLUMNS].reset_index(drop=True))


def test_recorded_replay_rebuilds_the_same_block_pool_events(replayed):
    eng, sim = replayed
    cols = ["step", "seq", "kind", "request_id", "block_ids", "hashes"]
    assert as_lists(sim.block_events[cols]).equals(as_lists(eng.block_events[cols]))


def test_recorded_replay_follows_the_engine_clock(replayed):
    eng, sim = replayed
    assert sim.steps["start"].to_numpy() == pytest.approx(eng.steps["start"].to_numpy(), abs=1e-9)
    assert sim.steps["end"].to_numpy() == pytest.approx(eng.steps["end"].to_numpy(), abs=1e-6)
    a, b = eng.requests.set_index("request_id"), sim.requests.set_index("request_id").loc[eng.requests["request_id"]]
    assert b["queued"].to_numpy() == pytest.approx(a["queued"].to_numpy(), abs=1e-9)
    assert list(b["output_token_ids"].map(list)) == list(a["output_token_ids"].map(list))


def test_recorded_replay_keeps_each_steps_execute_time_as_its_device_time(replayed):
    """Otherwise a replay compared with its own source reads as a slower device (same-shape speed > 1)."""
    eng, sim = replayed
    a, b = eng.steps.sort_values("step"), sim.steps.sort_values("step")
    assert (a["execute_time"] > 0).all()
    assert (b["execute_time"].to_numpy() == a["execute_time"].to_numpy()).mean() > 0.99

def test_sim_trace_meta_names_source_and_cost_model(replayed, engine_trace):
    _, sim = replayed
    assert sim.meta["source"] == "sim" and sim.complete
    assert sim.meta["cost_model"]["name"] == "recorded"
    assert sim.meta["cost_model"]["source_trace"] == str(engine_trace)
    assert sim.meta["config"]["cache"]["num_gpu_blocks"] == 20
    assert sim.meta["config"]["scheduler"]["max_num_batched_tokens"] == 48


def _record_with_stops_and_aborts(path):
    """Torch-free source trace on the engine's timeline (arrivals between steps): a request stopping
    on EOS, one aborted between steps, one rejected at admission."""
    sched = make_scheduler(num_blocks=12, block_size=4, max_model_len=40, max_num_seqs=4)
    now = [0.0]
    sched.clock = lambda: now[0]
    rec = TraceRecorder(TraceWriter(path, {"source": "engine", "config": {
        "scheduler": sched.scheduler_config.to_dict(), "cache": sched.cache_config.to_dict()}}), sched)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    arrivals = {"r0": 0.0, "r1": 0.8, "big": 0.9, "r2": 1.8, "r3": 2.8, "r4": 3.8}
    pending = [Request(rid, list(range(100 + 10 * i, 106 + 11 * i)) if rid != "big" else list(range(60)), params,
                       eos_token_id=EOS, arrival_time=t) for i, (rid, t) in enumerate(arrivals.items())]
    step = 0
    while sched.has_unfinished_requests() or pending or sched.has_pending_outputs():
        start = step + 0.1
        if step == 5:
            rec.on_abort(sched.finish_requests(["r2"], RequestStatus.FINISHED_ABORTED))
        while pending and pending[0].arrival_time <= start:
            r = pending.pop(0)
            now[0] = r.arrival_time
            sched.add_request(r)
            rec.on_add(r)
        now[0] = start
        so = sched.schedule()
        ids, sampled = [], []
        for rid in so.num_scheduled_tokens:
            r = sched.requests[rid]
            ids.append(rid)
            tok = EOS if rid == "r1" and r.num_output_tokens == 3 else 50 + r.num_output_tokens
            sampled.append([tok] if r.num_computed_tokens >= r.num_tokens else [])
        now[0] = step + 0.6
        outputs = sched.update_from_output(so, ModelRunnerOutput(ids, sampled))
        record_step(rec, so, outputs, start, now[0])
        step += 1
    rec.close()


def test_recorded_replay_reproduces_eos_stops_aborts_and_rejections(tmp_path):
    _record_with_stops_and_aborts(tmp_path / "src")
    assert main(["replay", str(tmp_path / "src"), "--trace", str(tmp_path / "sim"), "--no-progress"]) == 0
    src, sim = traces.load(tmp_path / "src"), traces.load(tmp_path / "sim")
    assert {"stop", "abort", "error"} <= set(src.requests["finish_reason"])
    assert as_lists(sim.decisions).equals(as_lists(src.decisions))
    reasons = lambda t: t.requests.set_index("request_id")["finish_reason"].sort_index().tolist()  # noqa: E731
    assert reasons(sim) == reasons(src)


class _LinearCost(CostModelDefaults):
    """A stand-in cost model: a fixed step cost plus per-token costs."""

    name = "linear-test"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(0.004 + 2e-5 * batch.num_prefill_tokens + 1e-4 * batch.num_decode_seqs)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, meta={"c0": 0.004})


class _SplitCost(CostModelDefaults):
    """Device time by decode tokens, host time by prefill tokens: a step's phases tell which step they timed."""

    name = "split-test"

    def step_time(self, batch: StepBatch, step: int) -> StepTiming:
        return StepTiming(1e-3 + 1e-4 * batch.num_decode_tokens, 5e-4 + 1e-5 * batch.num_prefill_tokens)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_step_records_the_cost_models_timing_of_that_very_step(tmp_path, async_scheduling):
    """execute_time is the step's device time and sample_time its host time, also under async scheduling,
    where the step being recorded is not the one launched last."""
    from engine.core import CacheConfig, SchedulerConfig

    sched = SchedulerConfig(max_model_len=8192, max_num_seqs=16, max_num_batched_tokens=512,
                            async_scheduling=async_scheduling)
    Simulator(sched, CacheConfig(block_size=16, num_gpu_blocks=300), _SplitCost(), tmp_path / "t").run(
        open_source(BURSTY, 32000, 40).requests)
    steps = traces.load(tmp_path / "t").steps
    assert (steps["num_prefill_tokens"] > 0).any() and (steps["num_decode_tokens"] > 0).any()
    assert steps["execute_time"].to_numpy() == pytest.approx(1e-3 + 1e-4 * steps["num_decode_tokens"].to_numpy())
    assert steps["sample_time"].to_numpy() == pytest.approx(5e-4 + 1e-5 * steps["num_prefill_tokens"].to_numpy())
    assert (steps["schedule_time"] == 0).all()

def _simulate(tmp_path, name, seed=0, workload=BURSTY, limit=40):
    from engine.core import CacheConfig, SchedulerConfig

    src = open_source(workload, 32000, limit)
    sim = Simulator(SchedulerConfig(max_model_len=8192, max_num_seqs=16, max_num_batched_tokens=512),
                    CacheConfig(block_size=16, num_gpu_blocks=300), _LinearCost(), tmp_path / name,
                    {"workload": src.meta}, seed=seed)
    result = sim.run(src.requests)
    return sim, result, traces.load(tmp_path / name)


def test_same_seed_and_inputs_give_identical_trace_tables(tmp_path):
    _, _, a = _simulate(tmp_path, "a")
    _, _, b = _simulate(tmp_path, "b")
    assert (a.steps["num_preempted"] > 0).any()
    for table in ("steps", "requests", "decisions", "block_events", "block_snapshots"):
        assert as_lists(getattr(a, table)).equals(as_lists(getattr(b, table))), table


def test_fabricated_tokens_depend_on_the_seed_but_decisions_do_not(tmp_path):
    _, _, a = _simulate(tmp_path, "a", seed=1, limit=10)
    _, _, b = _simulate(tmp_path, "b", seed=2, limit=10)
    assert as_lists(a.decisions).equals(as_lists(b.decisions))
    outs = lambda t: t.requests.sort_values("request_id")["output_token_ids"].map(list).tolist()  # noqa: E731
    assert outs(a) != outs(b)


def test_workload_replay_keeps_no_state_for_finished_requests(tmp_path):
    sim, result, t = _simulate(tmp_path, "a")
    assert result.num_requests == 40 and set(t.requests["finish_reason"]) == {"length"}
    assert not sim.replica.scheduler.requests and not sim.replica.recorder.live
    assert not sim.replica.runner._base and not sim.replica.runner._recorded
    assert not sim.replica.scheduler.kv_cache_manager.req_to_blocks


def test_workload_replay_sees_arrivals_on_the_simulated_clock(tmp_path):
    _, result, t = _simulate(tmp_path, "a")
    req = t.requests
    assert (req["queued"] >= req["arrival"] - 1e-12).all()
    assert (req["first_token"] > req["arrival"]).all()
    assert result.sim_time == pytest.approx(t.steps["end"].max())


def test_cli_workload_replay_prints_summary_goodput_and_plots(tmp_path, capsys):
    pytest.importorskip("sim.cost_models.roofline")
    rc = main(["replay", BURSTY, "--cost-model", "roofline", "--model", "qwen3-0.6b",
               "--hardware", "h100", "--max-requests", "30", "--slo", "ttft_p99=2s,tpot_p99=80ms",
               "--plots", str(tmp_path / "plots"), "--trace", str(tmp_path / "t"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "goodput:" in out and "itl: p50" in out and "ttft_p99<=2000ms" in out
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"latency_cdf.png", "throughput.png", "queues.png",
                                                                "kv_usage.png"}
    assert traces.load(tmp_path / "t").meta["cost_model"]["name"] == "roofline"


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for n in needles:
        assert n in err
    return err


def test_workload_replay_with_recorded_cost_model_is_an_error(capsys):
    _one_line_error(capsys, ["replay", BURSTY, "--cost-model", "recorded", "--no-progress"],
                    "recorded", "trace")


def test_malformed_workload_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_requests: 10\narrival: {process: gamma, rate: -1, cv: 2}\n"
                   "prompt_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 8}\n")
    _one_line_error(capsys, ["replay", str(bad), "--no-progress"], str(bad), "arrival.rate")


def test_trace_of_another_format_version_is_one_line_exit_2(tmp_path, capsys):
    _record_with_stops_and_aborts(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    (tmp_path / "t" / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    _one_line_error(capsys, ["replay", str(tmp_path / "t"), "--no-progress"], "format_version", "99")


def test_unknown_cost_model_is_one_line_exit_2(capsys):
    _one_line_error(capsys, ["replay", BURSTY, "--cost-model", "magic"], "magic", "recorded")


def test_bad_flag_value_is_one_line_exit_2(tmp_path, capsys):
    _record_with_stops_and_aborts(tmp_path / "t")
    _one_line_error(capsys, ["replay", str(tmp_path / "t"), "--max-num-seqs", "0"], "--max-num-seqs")
    _one_line_error(capsys, ["replay", str(tmp_path / "t"), "--max-num-seqs", "x"], "--max-num-seqs")
    _one_line_error(capsys, ["replay", str(tmp_path / "t"), "--slo", "ttft=fast"], "--slo")


def test_itl_has_one_gap_per_output_token_after_the_first():
    from sim.report.summary import inter_token_latencies

    rows = [(0, "a", "schedule", "prefill"), (1, "a", "schedule", "prefill"), (2, "a", "schedule", "decode"),
            (3, "a", "schedule", "decode"), (3, "a", "finish", None),
            (0, "b", "schedule", "prefill"), (1, "b", "schedule", "decode"), (2, "b", "preempt", None),
            (3, "b", "schedule", "prefill"), (4, "b", "schedule", "decode"), (4, "b", "finish", None)]
    decisions = pd.DataFrame(rows, columns=["step", "request_id", "event", "phase"]).sort_values("step", kind="stable")
    steps = pd.DataFrame({"step": range(5), "end": [1.0, 2.0, 3.0, 4.0, 6.0]})
    assert sorted(inter_token_latencies(decisions, steps).tolist()) == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_goodput_counts_requests_meeting_every_slo():
    from types import SimpleNamespace

    from sim.report.summary import sim_summary
    from traces.metrics import parse_slo

    req = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival": [0.0, 0.0, 0.0], "queued": [0.0] * 3,
                        "first_scheduled": [0.0] * 3, "first_token": [0.5, 3.0, 0.5], "finish": [1.5, 4.0, 10.5],
                        "num_prompt_tokens": [4] * 3, "num_output_tokens": [11] * 3, "num_cached_tokens": [0] * 3,
                        "num_preemptions": [0] * 3, "finish_reason": ["length"] * 3})
    steps = pd.DataFrame({"step": [0], "end": [10.5], "kv_blocks_used": [1], "kv_blocks_total": [10]})
    decisions = pd.DataFrame(columns=["step", "request_id", "event", "phase"])
    s = sim_summary(SimpleNamespace(requests=req, steps=steps, decisions=decisions),
                    parse_slo("ttft_p99=2s,tpot_p50=200ms"))
    assert s["goodput_req_s"] == pytest.approx(1 / 10.5)  # only "a": b is late, c decodes at 1 s/token
    assert [a["met"] for a in s["slos"]] == [False, True]


def test_slo_parser_reads_units_and_names_bad_parts():
    from traces.metrics import parse_slo

    a, b = parse_slo("ttft_p99=2s, tpot_p90=80ms")
    assert (a.metric, a.percentile, a.threshold_s) == ("ttft", 99.0, 2.0)
    assert (b.metric, b.percentile, b.threshold_s) == ("tpot", 90.0, pytest.approx(0.08))
    with pytest.raises(ValueError, match="latency"):
        parse_slo("latency_p99=1s")
