"""stepscope sim (torch-free)."""
