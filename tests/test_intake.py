"""The engine's intake of arrivals (sim.cost_models.intake): wake-up delays and per-request adds read off a trace's
arrival and queued times, and a simulator that takes a burst arriving within a wake-up in one step."""
from types import SimpleNamespace

import pandas as pd
import pytest

from engine.core.config import CacheConfig, SchedulerConfig
from sim.cost_models.intake import Intake, fit_intake, intake_samples
from sim.core.simulator import Simulator
from sim.core.sources import SimRequest
from sim_helpers import FixedCost
import traces


def _trace(requests, steps):
    return SimpleNamespace(requests=pd.DataFrame(requests, columns=["arrival", "queued"]),
                           steps=pd.DataFrame([(i, s, e) for i, (s, e) in enumerate(steps)],
                                              columns=["step", "start", "end"]))


def test_a_request_arriving_at_an_idle_engine_gives_its_wake_delay():
    # Idle since 1.0; the request arrives at 2.0, is queued at 2.003, the step starts at 2.004.
    t = _trace([(0.5, 0.5001), (2.0, 2.003)], [(0.5002, 1.0), (2.004, 2.1)])
    wakes, adds = intake_samples(t)
    assert wakes == pytest.approx([0.0001, 0.003])
    assert adds == []


def test_requests_added_one_after_another_give_the_per_request_add():
    # Three arrive within the wake-up and are queued 0.2 ms apart before one step.
    t = _trace([(2.0, 2.001), (2.0001, 2.0012), (2.0002, 2.0014)], [(2.0015, 2.1)])
    wakes, adds = intake_samples(t)
    assert wakes == pytest.approx([0.001])
    assert adds == pytest.approx([0.0002, 0.0002])


def test_a_request_arriving_while_a_step_runs_is_no_wake_up():
    t = _trace([(0.0, 0.0001), (0.05, 0.1001)], [(0.0002, 0.1), (0.1002, 0.2)])
    wakes, _ = intake_samples(t)
    assert wakes == pytest.approx([0.0001])  # only the first, which found the engine idle


def test_the_fit_keeps_the_runs_first_cold_wake_apart_from_the_median():
    cold = _trace([(1.0, 1.005), (3.0, 3.0005), (5.0, 5.0007)], [(1.006, 1.1), (3.001, 3.1), (5.001, 5.1)])
    fit = fit_intake([cold])
    assert fit.first_wake_s == pytest.approx(0.005)
    assert fit.wake_s == pytest.approx(0.0006)


class _WithIntake(FixedCost):
    def __init__(self, intake):
        self._intake = intake

    @property
    def intake(self):
        return self._intake


def _first_step_requests(tmp_path, cost):
    burst = [SimRequest(request_id=f"r{i}", arrival=1.0 + i * 2e-4, prompt_token_ids=list(range(5, 37)),
                        max_tokens=4, add_time=1.0 + i * 2e-4) for i in range(4)]
    Simulator(SchedulerConfig(max_model_len=256), CacheConfig(block_size=16, num_gpu_blocks=64), cost,
              tmp_path).run(burst)
    d = traces.load(tmp_path).decisions
    return sorted(d[(d["step"] == 0) & (d["event"] == "schedule")]["request_id"])


def test_a_burst_within_the_wake_up_is_taken_in_one_step(tmp_path):
    assert _first_step_requests(tmp_path / "a", _WithIntake(Intake(wake_s=1e-3, per_request_s=1e-4))) == [
        "r0", "r1", "r2", "r3"]


def test_without_an_intake_the_step_starts_at_the_first_arrival(tmp_path):
    assert _first_step_requests(tmp_path / "b", FixedCost()) == ["r0"]


def test_each_add_after_a_wake_up_delays_the_step(tmp_path):
    Simulator(SchedulerConfig(max_model_len=256), CacheConfig(block_size=16, num_gpu_blocks=64),
              _WithIntake(Intake(wake_s=1e-3, per_request_s=1e-4)), tmp_path).run(
        [SimRequest(request_id=f"r{i}", arrival=1.0, prompt_token_ids=list(range(5, 37)), max_tokens=4,
                    add_time=1.0) for i in range(3)])
    t = traces.load(tmp_path)
    assert sorted(t.requests["queued"]) == pytest.approx([1.001, 1.0011, 1.0012])
    assert t.steps["start"].iloc[0] == pytest.approx(1.0013)


def _burst_during_cold_first_add(tmp_path, cold_admits_arrivals: bool):
    burst = [SimRequest(request_id=f"r{i}", arrival=t, prompt_token_ids=list(range(5, 37)), max_tokens=4, add_time=t)
             for i, t in enumerate((1.0, 1.0, 1.0012, 1.0012))]
    intake = Intake(wake_s=1e-3, per_request_s=1e-4, first_wake_s=0.011, cold_admits_arrivals=cold_admits_arrivals)
    Simulator(SchedulerConfig(max_model_len=256), CacheConfig(block_size=16, num_gpu_blocks=64),
              _WithIntake(intake), tmp_path).run(burst)
    return traces.load(tmp_path)


def test_an_engine_that_adds_after_its_cold_first_wake_takes_what_arrived_meanwhile(tmp_path):
    t = _burst_during_cold_first_add(tmp_path, cold_admits_arrivals=True)
    d = t.decisions
    assert sorted(d[(d["step"] == 0) & (d["event"] == "schedule")]["request_id"]) == ["r0", "r1", "r2", "r3"]
    assert t.steps["start"].iloc[0] == pytest.approx(1.0 + 0.011 + 4 * 1e-4)  # one add each


def test_the_fit_learns_whether_arrivals_during_the_cold_first_add_joined_the_first_step():
    # r1 arrives 1 ms after r0, whose add ends at 1.011; the first step starts at 1.012 (with r1) or not.
    joined = _trace([(1.0, 1.011), (1.001, 1.0112)], [(1.012, 1.1)])
    waited = _trace([(1.0, 1.011), (1.001, 1.1002)], [(1.012, 1.1), (1.1003, 1.2)])
    alone = _trace([(1.0, 1.011), (2.0, 2.0005)], [(1.012, 1.1), (2.001, 2.1)])
    assert fit_intake([joined]).cold_admits_arrivals is True
    assert fit_intake([waited]).cold_admits_arrivals is False
    assert fit_intake([alone]).cold_admits_arrivals is None


def test_requests_arriving_during_the_runs_cold_first_add_wait_for_the_next_step(tmp_path):
    """Where the calibration runs showed it (vLLM-CPU's front end adds one request after another), the
    first add is slow, not late: it starts at the first arrival, and what arrives while it adds joins the
    step after."""
    t = _burst_during_cold_first_add(tmp_path, cold_admits_arrivals=False)
    d = t.decisions
    assert sorted(d[(d["step"] == 0) & (d["event"] == "schedule")]["request_id"]) == ["r0", "r1"]
    assert t.steps["start"].iloc[0] == pytest.approx(1.0 + 2 * 1e-4 + 0.011)  # r0 and r1 added, then the cold rest
