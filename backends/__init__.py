"""kvgate: backends."""
