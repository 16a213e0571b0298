"""kvgate: gateway."""
