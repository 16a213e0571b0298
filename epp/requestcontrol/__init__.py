"""What happens around a pick: picks told to sibling workers and shared between replicas, and
the home of a stored response (GIE's ``requestcontrol/``)."""
