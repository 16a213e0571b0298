"""gRPC servers of the endpoint picker: Envoy ext_proc (GIE protocol), the Pick API, health."""
