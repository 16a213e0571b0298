"""Serving the gateway: reloads, workers, traces, the response cache, the load tester."""
