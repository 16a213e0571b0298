"""kvgate: policies."""
