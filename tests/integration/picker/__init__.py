"""The endpoint picker: embedded, behind Envoy, over gRPC; zones, adapters, replicas, PD."""
