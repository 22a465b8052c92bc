"""stepscope sim (torch-free): a discrete-event simulator on the engine's own scheduler.

`sim.loop.Simulator` runs it, `sim.core.sources` feeds it (workload files, engine traces), `sim.cost_models`
prices steps, `sim.fidelity.compare` measures fidelity, `sim.cli` is the `sim` command. Nothing is imported here.
"""
