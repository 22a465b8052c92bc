"""Textual widgets of the TUI: a virtualised table, the run timeline, the block map."""
