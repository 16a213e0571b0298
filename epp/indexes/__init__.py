"""EPP indexes plugins."""
