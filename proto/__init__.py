"""kvgate: proto."""
