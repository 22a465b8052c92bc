"""Recording hand-built steps into a trace, as the step cycle records them."""
from engine.core.outputs import EngineCoreOutputs
from engine.core.sched_output import SchedulerOutput
from traces.recorder import TraceRecorder


def record_step(rec: TraceRecorder, so: SchedulerOutput, outputs: EngineCoreOutputs, start: float, end: float,
                schedule_time: float = 0.0, execute_time: float = 0.0, sample_time: float = 0.0) -> list:
    """The recorder's next step, from `start` to `end`, its phases taking the times given."""
    t_execute = start + schedule_time
    times = (start, t_execute, t_execute + execute_time, t_execute + execute_time + sample_time, end)
    return rec.on_step(rec.num_steps, so, outputs, times)
