"""stepscope sim (torch-free): a discrete-event simulator on the engine's own scheduler.

Its packages, each importing only those before it: `sim.cost_models` (what a step costs), `sim.core` (the one
event loop, `sim.core.cluster.Cluster`, of which `sim.core.simulator.Simulator` is the one-replica case,
fed by `sim.core.sources`), `sim.report` (what a replay
prints and draws), `sim.calibration` (laws fitted to traces), `sim.fidelity` (`sim compare` and real runs
brought in), `sim.plan` (`sim plan`); `sim.cli` is the `sim` command. Nothing is imported here.
"""
