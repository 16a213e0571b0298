"""kvgate: backends/engine."""
