"""The model registry, canaries' shared state, admin roles, operations and Prometheus."""
