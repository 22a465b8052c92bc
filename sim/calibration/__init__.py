"""Step-time laws fitted to recorded traces."""
