"""Automatic canaries: the weight of a route's canary pool, advanced step by step while the
canary is as good as its baseline, and rolled back when it is not."""
