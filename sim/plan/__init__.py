"""Capacity planning: the highest rate each configuration sustains within the SLOs."""
