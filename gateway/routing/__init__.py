"""Traffic routing: canary splits, sticky A/B tests, shadow copies."""
