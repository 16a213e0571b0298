"""kvgate: epp."""
