"""The simulator's loop: one replica or a cluster stepping the engine's own Scheduler against a cost model."""
