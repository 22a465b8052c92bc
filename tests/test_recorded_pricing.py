"""Recorded step times price only the recorded schedule: a replay whose flags change it is refused in one
line naming the flag, and a step whose batch is not the recorded one is an error, never a time looked up
by index for another batch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.cli import main as sim_main
from sim.cost_models.batch import StepBatch
from sim.cost_models.recorded import RecordedCostModel, ScheduleDeparted

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A trace with recorded step times (a replay of a workload writes them like an engine run)."""
    out = tmp_path_factory.mktemp("rec") / "t"
    assert sim_main(["replay", str(ROOT / "workloads" / "bursty.yaml"), "--max-requests", "12", "--trace", str(out),
                     "--no-progress", "--model", "qwen3-0.6b", "--hardware", "h100", "--json"]) == 0
    return out


def test_a_replay_on_recorded_times_that_changes_the_schedule_is_refused_naming_the_flag(recorded, tmp_path, capsys):
    capsys.readouterr()
    assert sim_main(["replay", str(recorded), "--max-num-seqs", "2", "--trace", str(tmp_path / "r"),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sim replay: error: --max-num-seqs 2: changes the schedule"), err
    assert not (tmp_path / "r" / "steps.parquet").exists()


def test_the_same_replay_on_recorded_times_runs(recorded, tmp_path):
    assert sim_main(["replay", str(recorded), "--cost-model", "recorded", "--trace", str(tmp_path / "r"),
                     "--no-progress", "--json"]) == 0


def test_a_step_whose_batch_is_not_the_recorded_one_is_an_error():
    model = RecordedCostModel(np.array([0.0, 1.0]), np.array([1.0, 2.0]), batches=[(16, 0), (0, 1)])
    assert model.step_time(StepBatch(num_prefill_tokens=16), 0).total == 1.0
    with pytest.raises(ScheduleDeparted, match="step 1 schedules 0 prefill and 2 decode"):
        model.step_time(StepBatch(num_decode_tokens=2), 1)
    with pytest.raises(ScheduleDeparted, match="past the trace's 2 recorded steps"):
        model.step_time(StepBatch(num_decode_tokens=1), 2)
