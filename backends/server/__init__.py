"""kvgate: backends/server."""
