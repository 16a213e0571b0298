"""Token-bucket rate limits: rules, buckets, and the in-memory and Redis stores."""
