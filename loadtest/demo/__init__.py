"""``kvgate demo``: what KV-cache-aware routing buys, against a load-only baseline, on one
seeded workload (see ``loadtest.demo.main``)."""
