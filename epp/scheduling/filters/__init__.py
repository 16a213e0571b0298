"""EPP filters plugins."""
