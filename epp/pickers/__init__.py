"""EPP pickers plugins."""
