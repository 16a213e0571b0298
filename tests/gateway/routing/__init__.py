"""Choosing an endpoint: pickers, breakers, arms, adapters."""
