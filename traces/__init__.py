"""stepscope traces (torch-free)."""
