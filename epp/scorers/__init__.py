"""EPP scorers plugins."""
