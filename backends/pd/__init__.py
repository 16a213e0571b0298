"""Prefill/decode disaggregation: the KV connector, the block transfer service and client."""
