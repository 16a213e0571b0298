"""kvgate: loadtest."""
