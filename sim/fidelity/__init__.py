"""How far a replay is from the run it stands for: comparison, error split, real vLLM runs brought in."""
