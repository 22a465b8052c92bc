"""What a replay prints and draws."""
