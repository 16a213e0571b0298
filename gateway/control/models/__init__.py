"""The model registry: each public model's versions, their stages, and their changes."""
