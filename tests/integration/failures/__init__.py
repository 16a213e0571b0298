"""Engines and endpoints that fail: retries, breakers, dead pools, blame."""
