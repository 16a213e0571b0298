"""Processes on loopback for tests and benchmarks: kvgate commands started, waited for and
stopped; their CPU and memory."""
