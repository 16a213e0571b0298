"""What every wing uses."""
