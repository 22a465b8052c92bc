"""stepscope tui (torch-free)."""
