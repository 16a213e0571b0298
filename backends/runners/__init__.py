"""kvgate: backends/runners."""
