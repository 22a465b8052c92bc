"""The one step cycle shared by the engine, the simulator and each replica: its call order and clock."""
from __future__ import annotations

from core_helpers import EOS, make_requests

from engine.core import CacheConfig, ModelRunnerOutput, SchedulerConfig, make_scheduler
from engine.core.step_cycle import StepCycle
from sim.cost_models.base import CostModelInfo, StepTiming
from sim.cost_models.base import CostModelDefaults


class _Runner:
    """One token per request that finished its prompt; logs the calls it sees."""

    def __init__(self, sched, calls: list[str]) -> None:
        self.sched, self.calls, self.queue = sched, calls, []

    def execute_model(self, so) -> None:
        self.calls.append("execute")
        ids = list(so.num_scheduled_tokens)
        self.queue.append(ModelRunnerOutput(ids, [[] if self.sched.requests[r].is_prefill_chunk else [7] for r in ids]))

    def sample_tokens(self) -> ModelRunnerOutput:
        self.calls.append("sample")
        return self.queue.pop(0)


class _Recorder:
    def __init__(self) -> None:
        self.added, self.steps = [], []

    def on_add(self, request) -> None:
        self.added.append(request.request_id)

    def on_step(self, step, so, outputs, times, cost=None) -> None:
        self.steps.append((so.total_num_scheduled_tokens, times))


def _cycle(async_scheduling: bool, calls: list[str], now: list[float]):
    sched = make_scheduler(SchedulerConfig(max_model_len=256, max_num_batched_tokens=64,
                                           async_scheduling=async_scheduling),
                           CacheConfig(block_size=4, num_gpu_blocks=64), clock=lambda: now[0])
    original = sched.schedule
    sched.schedule = lambda: (calls.append("schedule"), original())[1]
    recorder = _Recorder()
    cycle = StepCycle(sched, _Runner(sched, calls), lambda: now[0], recorder, 2 if async_scheduling else 1)
    return cycle, recorder


def _outputs_by_request(cycle: StepCycle, max_calls: int = 200) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(max_calls):
        if not (cycle.has_work() or cycle.in_flight):
            return tokens
        for out in cycle.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("the cycle did not drain")


def test_sync_step_is_schedule_execute_sample_then_record() -> None:
    calls: list[str] = []
    cycle, recorder = _cycle(False, calls, [0.0])
    for req in make_requests(2, num_tokens=6, max_tokens=3):
        cycle.add_request(req)
    cycle.step()
    assert calls == ["schedule", "execute", "sample"]
    assert recorder.added == ["r0", "r1"] and recorder.steps[0][0] == 12


def test_async_step_schedules_the_next_batch_before_applying_the_last() -> None:
    calls: list[str] = []
    cycle, recorder = _cycle(True, calls, [0.0])
    cycle.add_request(make_requests(1, num_tokens=6, max_tokens=3)[0])
    assert cycle.step().outputs == [] and calls == ["schedule", "execute"]
    outputs = cycle.step().outputs
    assert calls == ["schedule", "execute", "schedule", "execute", "sample"]
    assert [o.new_token_ids for o in outputs] == [[7]] and len(cycle.in_flight) == 1


def test_async_and_sync_cycles_produce_the_same_tokens() -> None:
    runs = []
    for async_scheduling in (False, True):
        cycle, _ = _cycle(async_scheduling, [], [0.0])
        for req in make_requests(3, num_tokens=9, max_tokens=5, ignore_eos=True):
            cycle.add_request(req)
        runs.append(_outputs_by_request(cycle))
    assert runs[0] == runs[1] and all(len(t) == 5 for t in runs[0].values())


def test_async_finish_on_eos_lands_one_step_later_and_drains() -> None:
    """The step after the EOS was scheduled before the EOS was known; its token is dropped."""
    cycle, recorder = _cycle(True, [], [0.0])
    req = make_requests(1, num_tokens=4, max_tokens=10)[0]
    cycle.add_request(req)
    cycle.runner.execute_model = _eos_after(cycle.runner, 2)
    tokens = _outputs_by_request(cycle)
    assert tokens == {"r0": [7, EOS]} and not cycle.in_flight
    assert [n for n, _ in recorder.steps] == [4, 1, 1]


def _eos_after(runner: _Runner, n: int):
    original = runner.execute_model
    seen = [0]

    def execute_model(so) -> None:
        original(so)
        out = runner.queue[-1]
        for row in out.sampled_token_ids:
            if row:
                seen[0] += 1
                if seen[0] == n:
                    row[0] = EOS
    return execute_model


def test_recorded_times_follow_the_cycle_clock() -> None:
    now = [5.0]
    cycle, recorder = _cycle(False, [], now)
    cycle.add_request(make_requests(1, num_tokens=4, max_tokens=1)[0])
    cycle.begin()
    now[0] = 7.5  # the shell moves its clock while the step runs (the simulator's cost model)
    cycle.finish()
    assert recorder.steps[0][1] == (5.0, 5.0, 7.5, 7.5, 7.5)


def test_engine_with_async_scheduling_generates_what_the_synchronous_engine_does() -> None:
    """Greedy tokens are the same; only the order of the scheduler's calls differs."""
    import pytest

    pytest.importorskip("torch")
    from engine import LLM, SamplingParams

    prompts = [{"prompt_token_ids": [5, 17, 42, 8, 9]}, {"prompt_token_ids": [11, 12] * 9}, "Hello"]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = []
    for async_scheduling in (False, True):
        llm = LLM(model=None, device="cpu", max_num_seqs=2, max_num_batched_tokens=16,
                  async_scheduling=async_scheduling)
        assert llm.llm_engine.engine_core.engine_core.cycle.batch_queue_size == (2 if async_scheduling else 1)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert runs[0] == runs[1]


class _LinearCost(CostModelDefaults):
    name = "linear-test"

    def step_time(self, batch, step: int) -> StepTiming:
        return StepTiming(0.004 + 2e-5 * batch.num_prefill_tokens + 1e-4 * batch.num_decode_seqs)

    def describe(self) -> CostModelInfo:
        return CostModelInfo(name=self.name, meta={"c0": 0.004})


def _simulate(tmp_path, async_scheduling: bool):
    import traces
    from sim.core.simulator import Simulator
    from sim.core.sources import open_source
    from workloads import DEFAULT_WORKLOAD

    src = open_source(str(DEFAULT_WORKLOAD), 32000, 30)
    name = "async" if async_scheduling else "sync"
    sim = Simulator(SchedulerConfig(max_model_len=8192, max_num_seqs=8, max_num_batched_tokens=512,
                                    async_scheduling=async_scheduling),
                    CacheConfig(block_size=16, num_gpu_blocks=400), _LinearCost(), tmp_path / name,
                    {"workload": src.meta})
    sim.run(src.requests)
    return traces.load(tmp_path / name)


def test_simulated_async_steps_overlap_and_produce_the_same_tokens(tmp_path) -> None:
    sync, async_ = _simulate(tmp_path, False), _simulate(tmp_path, True)
    assert async_.meta["config"]["scheduler"]["async_scheduling"] is True
    steps = async_.steps.sort_values("step")
    assert (steps["start"].to_numpy()[1:] < steps["end"].to_numpy()[:-1]).any()
    tokens = lambda t: t.requests.sort_values("request_id")["output_token_ids"].map(list).tolist()  # noqa: E731
    assert tokens(sync) == tokens(async_)


def test_perfetto_puts_overlapping_steps_on_their_own_track(tmp_path) -> None:
    from traces.perfetto import OVERLAP_TID, STEPS_TID, to_perfetto

    trace = _simulate(tmp_path, True)
    events = [e for e in to_perfetto([trace])["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "step"]
    assert {e["tid"] for e in events} >= {STEPS_TID, OVERLAP_TID}
    by_track: dict[int, list] = {}
    for e in events:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for slices in by_track.values():
        slices.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(slices, slices[1:])), "slices overlap on one track"
