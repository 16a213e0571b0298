"""Reports of measured runs: summaries, tables and plots."""
