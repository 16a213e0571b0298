"""The response cache: deterministic answers kept and replayed (``policies.cache_section``)."""
