"""Loops over many requests: automatic canaries, the model registry, SLOs, the spend report."""
