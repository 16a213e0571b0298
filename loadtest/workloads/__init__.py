"""Request generators: seeded, reproducible request bodies."""
